"""SIGTERM to a real `vllm-sidecar run` with clients that left their requests half-sent: a clean stop, no traceback."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import required_in_ci
from tests.loopback import LoopbackServer, respond, slow
from tests.security.certs import client_context, issue, make_ca, openssl_missing

HALF_REQUESTS = [
    b"",  # connected, sent nothing
    b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n",  # a head without its end
    b"POST /admin/pause HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-part-of-the-body",
]


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    server.routes.update({"/metrics": respond(body=b"vllm:num_requests_running 0\n"), "/health": respond()})
    yield server
    server.close()


def _stop_with_half_open_clients(process: SidecarProcess, clients: list[socket.socket]) -> tuple[int, float, str]:
    """SIGTERM while `clients` hold their connections open; the exit code, the seconds it took, the whole log."""
    try:
        time.sleep(0.3)  # accepted and reading: the daemon's read timeout (5 s) is far off
        code, took_s = process.stop(signal.SIGTERM)
    finally:
        for client in clients:
            client.close()
        process.kill()
    return code, took_s, process.log_path.read_text()


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_sigterm_with_half_open_connections_stops_without_a_traceback(
    vllm: LoopbackServer, tmp_path: Path, log_format: str
) -> None:
    process = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--log-format", log_format],
        tmp_path / "sidecar.log",
    )
    clients: list[socket.socket] = []
    try:
        process.wait_ready()
        for data in HALF_REQUESTS:
            client = socket.create_connection(("127.0.0.1", process.port), timeout=5)
            client.sendall(data)
            clients.append(client)
    finally:
        code, took_s, output = _stop_with_half_open_clients(process, clients)
    assert code == 0, output
    assert took_s < 5.0
    assert "Traceback" not in output, output
    assert "Exception in callback" not in output, output  # asyncio's own report of a handler task that failed
    last = output.rstrip("\n").splitlines()[-1]
    if log_format == "json":
        assert json.loads(last)["event"] == "stopped"
        assert not [line for line in output.splitlines() if '"exception"' in line]
    else:
        assert "stopped" in last.split(), last


def test_sigterm_with_half_done_tls_handshakes_and_requests_stops_without_a_traceback(
    vllm: LoopbackServer, tmp_path: Path
) -> None:
    missing = openssl_missing()
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"openssl is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(missing)
    ca = make_ca(tmp_path / "ca")
    pair = issue(ca, tmp_path / "server", "sidecar")
    process = SidecarProcess(
        [
            *("--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none"),
            *("--tls-cert-file", str(pair.cert), "--tls-key-file", str(pair.key)),
        ],
        tmp_path / "sidecar.log",
    )
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 20
        while '"event": "started"' not in process.log_path.read_text():
            assert time.monotonic() < deadline, process.log_path.read_text()
            assert process.process.poll() is None, process.log_path.read_text()
            time.sleep(0.1)
        address = ("127.0.0.1", process.port)
        clients.append(socket.create_connection(address, timeout=5))  # no handshake at all
        half_hello = socket.create_connection(address, timeout=5)
        half_hello.sendall(b"\x16\x03\x01\x00\xff\x01\x00")  # the start of a ClientHello
        clients.append(half_hello)
        tls = client_context(ca).wrap_socket(socket.create_connection(address, timeout=5), server_hostname="127.0.0.1")
        tls.sendall(HALF_REQUESTS[1])  # a finished handshake, then half a request
        clients.append(tls)
    finally:
        code, took_s, output = _stop_with_half_open_clients(process, clients)
    assert code == 0, output
    assert took_s < 5.0
    assert "Traceback" not in output, output
    assert not [line for line in output.splitlines() if '"exception"' in line], output
    assert json.loads(output.rstrip("\n").splitlines()[-1])["event"] == "stopped"


@pytest.mark.parametrize(("answer_after_s", "finished"), [(0.8, True), (8.0, False)])
def test_sigterm_mid_tick_gives_the_tick_its_grace_then_stops_without_a_traceback(
    tmp_path: Path, answer_after_s: float, finished: bool
) -> None:
    """A tick waiting on vLLM at SIGTERM finishes within the 2 s grace (its reading is logged); one that would
    take longer is cancelled at the grace's end. Either way no failed job, no traceback, exit 0."""
    vllm = LoopbackServer()
    vllm.routes.update({"/health": respond()})
    process = SidecarProcess(
        # The request's own deadline (2.9 s) is longer than the stop's grace (2 s), so the grace decides.
        ["--vllm-url", vllm.url, "--interval", "3", "--timeout", "2.9", "--gpu-source", "none"],
        tmp_path / "sidecar.log",
    )
    try:
        process.wait_ready()
        # From now on /metrics answers slowly: the next tick is in progress when SIGTERM comes.
        asked = vllm.hits.count("/metrics")
        vllm.routes["/metrics"] = slow(answer_after_s, respond(body=b"vllm:num_requests_running 0\n"))
        deadline = time.monotonic() + 30
        while vllm.hits.count("/metrics") == asked and time.monotonic() < deadline:
            time.sleep(0.02)
        code, _ = process.stop(signal.SIGTERM)
    finally:
        process.kill()
        vllm.close()
    output = process.log_path.read_text()
    assert code == 0, output
    assert "Traceback" not in output, output
    assert "raised an exception" not in output, output
    assert ("source_ok" in output) is finished, output
