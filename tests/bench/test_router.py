"""The benchmark's router against real loopback HTTP servers: readiness, round robin, pass-through, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.fleet import lost
from bench.router import Probe, Replica, Routed, Router, sidecar_readyz_timing, vllm_health_timing

PERIOD_S = 0.05


class _Backend:
    """A replica: /health answers `healthy`; POST echoes its name and body in two chunks."""

    def __init__(self, name: str) -> None:
        self.healthy = True
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(200 if backend.healthy else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in (name.encode(), b":" + body):
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def replica(self, failures: int = 2) -> Replica:
        probe = Probe(f"http://127.0.0.1:{self.port}/health", PERIOD_S, failures)
        return Replica(host="127.0.0.1", port=self.port, probes=(probe,))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backends() -> Iterator[tuple[_Backend, _Backend]]:
    pair = (_Backend("a"), _Backend("b"))
    yield pair
    for backend in pair:
        backend.stop()


def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _post(router: Router, body: bytes = b"x") -> httpx.Response:
    return httpx.post(router.url + "/v1/completions", content=body, timeout=5)


def test_round_robin_over_ready_replicas_passes_answers_through(backends: tuple[_Backend, _Backend]) -> None:
    a, b = backends
    # Readiness is not what this test is about: the probes' 50 ms timeout failed twice in a row on a starved CI
    # box and took b out (every prompt went to a). Here a replica stays in once a probe has passed.
    router = Router([a.replica(failures=1_000_000), b.replica(failures=1_000_000)]).start()
    try:
        _until(lambda: all(each.is_ready for each in router.replicas))
        answers = [_post(router, b"prompt %d" % n) for n in range(4)]
        assert [r.text for r in answers] == ["a:prompt 0", "b:prompt 1", "a:prompt 2", "b:prompt 3"]
        assert [r.status_code for r in answers] == [200] * 4
        assert httpx.get(router.url + "/health").status_code == 200  # the router's own
        assert (router.replicas[0].sent, router.replicas[1].sent, router.unrouted) == (2, 2, 0)
        _until(lambda: len(router.routed) == 4)  # appended as each answer ends
        assert [each.replica for each in router.routed] == [0, 1, 0, 1]
        assert all(each.answered_s is not None and each.answered_s >= each.sent_s for each in router.routed)
    finally:
        router.stop()


def test_a_replica_leaves_after_its_failure_threshold_and_returns(backends: tuple[_Backend, _Backend]) -> None:
    a, b = backends
    # b must stay in while a is out: at 2 failures, two of its 50 ms probes timing out on a starved CI box took it
    # out too (run 49: "no ready replica"). 20 failures in a row (1 s of them) take it out when it fails for real.
    router = Router([a.replica(failures=2), b.replica(failures=20)]).start()
    try:
        _until(lambda: router.replicas[1].is_ready)
        a.healthy = False
        _until(lambda: not router.replicas[0].is_ready)
        assert {_post(router).text for _ in range(4)} == {"b:x"}
        b.healthy = False
        _until(lambda: not router.replicas[1].is_ready, timeout_s=10)
        refused = _post(router)
        assert (refused.status_code, refused.text) == (503, "no ready replica")
        assert router.unrouted == 1
        a.healthy = True
        _until(lambda: router.replicas[0].is_ready)
        assert _post(router).text == "a:x"
    finally:
        router.stop()


def test_a_replica_gone_between_probes_fails_the_request_without_retry(backends: tuple[_Backend, _Backend]) -> None:
    a, _ = backends
    router = Router([a.replica(failures=1000)]).start()  # still "ready": the probes have not caught up
    try:
        a.stop()
        assert _post(router).status_code == 502
        _until(lambda: len(router.routed) == 1)
        assert [each.answered_s for each in router.routed] == [None]
    finally:
        router.stop()


def test_probes_are_the_shipped_manifests() -> None:
    assert vllm_health_timing().period_s == 5.0
    assert (sidecar_readyz_timing().period_s, sidecar_readyz_timing().failure_threshold) == (1.0, 1)


def test_failed_completions_are_told_apart_by_when_they_reached_a_hang() -> None:
    hung = [(100.0, 110.0)]  # A made no progress from 100 s to 110 s
    routed = [
        Routed(sent_s=95.0, replica=0, answered_s=None),  # running inside A when it stopped
        Routed(sent_s=99.5, replica=0, answered_s=115.0),  # answered, but after the client's 10 s
        Routed(sent_s=103.0, replica=0, answered_s=None),  # sent to A while it was hung
        Routed(sent_s=111.0, replica=0, answered_s=None),  # after: a restart's gap
        Routed(sent_s=88.0, replica=0, answered_s=None),  # over 10 s before the hang: not the hang's doing
        Routed(sent_s=95.0, replica=0, answered_s=100.5),  # answered in time
        Routed(sent_s=101.0, replica=1, answered_s=None),  # B's
        Routed(sent_s=102.0, replica=1, answered_s=104.0),  # B's, answered
    ]
    counted = lost(routed, hung)
    assert (counted.in_flight_at_a_hang, counted.sent_while_hung, counted.other_on_a, counted.on_b) == (2, 1, 2, 1)
