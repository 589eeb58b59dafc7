"""The small HTTP/1.1 client (sidecar.sources.http_get) against real loopback servers.

First every scenario of the vLLM source's and the simulated-GPU source's own tests again (test_vllm_http_source,
test_sim_gpu_source), with this client in place of httpx: the same readings and the same error lines. Then what
only this client does: keep-alive reuse, a connection the server closed while idle, chunked and read-to-close
bodies, gzip and deflate sent although identity was asked for (and a gzip bomb), truncated answers, non-HTTP
answers, names that resolve to several addresses, and a request cancelled half-way.
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from sidecar.sources.fetch import BodyFetcher, PlainHttpFetcher
from sidecar.sources.http_get import (
    AnswerTooLargeError,
    ConnectFailedError,
    ConnectionDroppedError,
    HttpGetClient,
)
from sidecar.sources.sim_gpu import SimGpuSource
from sidecar.sources.vllm_http import VllmHttpSource
from tests.adapters import test_sim_gpu_source as sim_gpu_scenarios
from tests.adapters import test_vllm_http_source as httpx_scenarios
from tests.loopback import LoopbackServer, closed_port, respond

# The vLLM source's scenarios, each run here with the `fetcher` fixture below (this client, not httpx).
test_reads_a_real_capture = httpx_scenarios.test_reads_a_real_capture
test_missing_version_endpoint_is_not_an_error = httpx_scenarios.test_missing_version_endpoint_is_not_an_error
test_vllm_down = httpx_scenarios.test_vllm_down
test_slower_than_the_timeout = httpx_scenarios.test_slower_than_the_timeout
test_a_host_name_no_request_can_carry_is_a_line_not_an_exception = (
    httpx_scenarios.test_a_host_name_no_request_can_carry_is_a_line_not_an_exception
)
test_trickling_body_is_bounded_by_one_deadline = httpx_scenarios.test_trickling_body_is_bounded_by_one_deadline
test_http_500 = httpx_scenarios.test_http_500
test_garbage = httpx_scenarios.test_garbage
test_binary_garbage = httpx_scenarios.test_binary_garbage
test_50_mb_body_with_content_length = httpx_scenarios.test_50_mb_body_with_content_length
test_50_mb_body_without_content_length = httpx_scenarios.test_50_mb_body_without_content_length
test_connection_dropped_mid_body = httpx_scenarios.test_connection_dropped_mid_body
test_disable_log_stats_is_a_problem_not_idle = httpx_scenarios.test_disable_log_stats_is_a_problem_not_idle
test_unhealthy = httpx_scenarios.test_unhealthy
test_a_200_from_health_stands_a_few_seconds_while_metrics_reads_and_anything_else_is_asked_again = (
    httpx_scenarios.test_a_200_from_health_stands_a_few_seconds_while_metrics_reads_and_anything_else_is_asked_again
)
test_version_is_asked_once_then_again_after_a_failed_poll = (
    httpx_scenarios.test_version_is_asked_once_then_again_after_a_failed_poll
)

# The simulator's GPU source, which the daemon points at the same client.
test_sim_gpu_reads_devices = sim_gpu_scenarios.test_reads_devices_and_classifies_owners
test_sim_gpu_malformed_documents = sim_gpu_scenarios.test_malformed_documents_are_one_line_errors
test_sim_gpu_down_slow_and_failing = sim_gpu_scenarios.test_down_slow_and_failing

CAPTURE = httpx_scenarios.CAPTURE
Raw = Callable[[socket.socket], None]


@pytest.fixture
async def client() -> AsyncIterator[HttpGetClient]:
    shared = HttpGetClient()
    yield shared
    await shared.aclose()


@pytest.fixture
def fetcher(client: HttpGetClient) -> BodyFetcher:
    """What the scenarios above read through: this client, as the daemon hands it to the sources."""
    return PlainHttpFetcher(client)


class KeepAliveServer:
    """http.server speaking HTTP/1.1 with keep-alive, as uvicorn does; counts connections and requests."""

    def __init__(self, body: bytes, *, idle_timeout_s: float = 5.0, close_after_answer: bool = False) -> None:
        self.connections = 0
        self.requests: list[str] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_timeout_s

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                outer.headers.append({key.lower(): value for key, value in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if close_after_answer:
                    self.close_connection = True  # closes without saying so: the race a reused connection meets

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def keep_alive() -> Iterator[Callable[..., KeepAliveServer]]:
    started: list[KeepAliveServer] = []

    def start(body: bytes = CAPTURE, **options: float | bool) -> KeepAliveServer:
        server = KeepAliveServer(body, **options)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def raw(head: bytes, body: bytes = b"", *, then_close: bool = True) -> Raw:
    def send(conn: socket.socket) -> None:
        conn.sendall(head + body)
        if then_close:
            conn.shutdown(socket.SHUT_RDWR)

    return send


def chunked(parts: list[bytes], *, finish: bool = True, extra_head: bytes = b"") -> Raw:
    def send(conn: socket.socket) -> None:
        out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + extra_head + b"Connection: close\r\n\r\n"
        for part in parts:
            out += f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
        if finish:
            out += b"0\r\nX-Trailer: yes\r\n\r\n"
        conn.sendall(out)
        conn.shutdown(socket.SHUT_RDWR)

    return send


async def test_keep_alive_reuses_one_connection_and_asks_for_identity(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer]
) -> None:
    server = keep_alive()
    for _ in range(5):
        answer = await client.get(server.url + "/metrics", max_bytes=2**20)
        assert (answer.status, answer.body) == (200, CAPTURE)
    assert server.connections == 1
    assert server.requests == ["/metrics"] * 5
    assert server.headers[0]["accept-encoding"] == "identity"
    assert server.headers[0]["host"] == server.url.removeprefix("http://")


async def test_concurrent_requests_get_their_own_connections(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer]
) -> None:
    server = keep_alive()
    for _ in range(3):
        answers = await asyncio.gather(*(client.get(server.url + "/x", max_bytes=2**20) for _ in range(2)))
        assert all(answer.body == CAPTURE for answer in answers)
    assert server.connections == 2  # then both kept: one per concurrent request, reused on every round


async def test_a_connection_closed_while_idle_is_replaced(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer]
) -> None:
    server = keep_alive(idle_timeout_s=0.2)  # uvicorn closes idle connections after 5 s; here sooner
    assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    await asyncio.sleep(0.6)
    assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    assert server.connections == 2


async def test_a_connection_closed_right_after_an_answer_is_retried_once(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer]
) -> None:
    server = keep_alive(close_after_answer=True)
    for _ in range(3):
        assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    assert server.requests == ["/metrics"] * 3


async def test_connection_close_is_honoured(client: HttpGetClient, server: LoopbackServer) -> None:
    server.routes["/metrics"] = respond(body=CAPTURE)  # says Connection: close
    for _ in range(3):
        assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    assert server.hits == ["/metrics"] * 3


async def test_chunked_body_with_extensions_and_trailers(client: HttpGetClient, server: LoopbackServer) -> None:
    parts = [CAPTURE[:1000], CAPTURE[1000:50_000], CAPTURE[50_000:]]
    server.routes["/metrics"] = chunked(parts)
    assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    result = await VllmHttpSource(
        fetcher=PlainHttpFetcher(client), base_url=server.url, timeout_s=2, max_body_bytes=2**20
    ).read()
    assert result.ok, result.error


async def test_chunked_body_over_the_cap(client: HttpGetClient, server: LoopbackServer) -> None:
    server.routes["/metrics"] = chunked([b"x" * 600, b"y" * 600])
    with pytest.raises(AnswerTooLargeError, match="exceeds the 1000 byte cap"):
        await client.get(server.url + "/metrics", max_bytes=1000)


@pytest.mark.parametrize(
    "behaviour",
    [
        chunked([b"abc"], finish=False),  # ends before the last chunk
        raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"zz\r\nabc\r\n"),  # not a hex size
        raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"3\r\nabcdef"),  # no CRLF after the chunk
        raw(b"HTTP/1.1 200 OK\r\nContent-Len"),  # headers cut short
        raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"12345"),  # body cut short
        raw(b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", b"12345"),
        raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),  # not HTTP
        raw(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"),  # headers beyond the limit
        raw(b"HTTP/1.1 200 OK\r\n bad header\r\n\r\n"),
        raw(b""),  # closed without a word
    ],
    ids=[
        "chunked-unfinished",
        "chunked-bad-size",
        "chunked-no-crlf",
        "headers-cut",
        "body-cut",
        "bad-content-length",
        "not-http",
        "huge-headers",
        "bad-header",
        "silent-close",
    ],
)
async def test_broken_answers_are_one_line_errors(
    client: HttpGetClient, server: LoopbackServer, behaviour: Raw
) -> None:
    server.routes["/metrics"] = behaviour
    with pytest.raises(ConnectionDroppedError) as caught:
        await client.get(server.url + "/metrics", max_bytes=2**20)
    assert "\n" not in str(caught.value)
    result = await VllmHttpSource(
        fetcher=PlainHttpFetcher(client), base_url=server.url, timeout_s=2, max_body_bytes=2**20
    ).read()
    assert result.error is not None
    assert result.error.startswith(f"vLLM {server.url}/metrics dropped the connection mid-answer: ")


async def test_body_until_close_without_length(client: HttpGetClient, server: LoopbackServer) -> None:
    server.routes["/metrics"] = raw(b"HTTP/1.0 200 OK\r\n\r\n", CAPTURE)
    assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    server.routes["/big"] = raw(b"HTTP/1.0 200 OK\r\n\r\n", b"x" * 5000)
    with pytest.raises(AnswerTooLargeError):
        await client.get(server.url + "/big", max_bytes=4096)


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS)),  # raw deflate, as some servers send
    ],
    ids=["gzip", "deflate", "raw-deflate"],
)
async def test_compressed_answers_are_decoded(
    client: HttpGetClient, server: LoopbackServer, encoding: str, encode: Callable[[bytes], bytes]
) -> None:
    body = encode(CAPTURE)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    server.routes["/metrics"] = raw(head, body)
    assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == CAPTURE


async def test_a_gzip_bomb_stops_at_the_cap(client: HttpGetClient, server: LoopbackServer) -> None:
    bomb = gzip.compress(b"\0" * 50 * 2**20)  # 50 KB on the wire, 50 MB decoded
    server.routes["/metrics"] = raw(
        f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n".encode(), bomb
    )
    with pytest.raises(AnswerTooLargeError, match="exceeds the 1048576 byte cap"):
        await client.get(server.url + "/metrics", max_bytes=2**20)


async def test_truncated_gzip_is_an_error(client: HttpGetClient, server: LoopbackServer) -> None:
    body = gzip.compress(CAPTURE)[:-20]
    server.routes["/metrics"] = raw(
        f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n".encode(), body
    )
    with pytest.raises(ConnectionDroppedError, match="gzip"):
        await client.get(server.url + "/metrics", max_bytes=2**20)


async def test_refused_unresolvable_and_several_addresses(client: HttpGetClient, server: LoopbackServer) -> None:
    with pytest.raises(ConnectFailedError) as refused:
        await client.get(f"http://127.0.0.1:{closed_port()}/health", max_bytes=100)
    assert refused.value.refused
    assert str(refused.value) == "connection refused"
    with pytest.raises(ConnectFailedError) as unresolvable:
        await client.get("http://no-such-host.invalid/health", max_bytes=100)
    assert not unresolvable.value.refused
    # localhost may resolve to ::1 first, where nothing listens: the next address is tried.
    server.routes["/health"] = respond()
    assert (await client.get(f"http://localhost:{server.port}/health", max_bytes=100)).status == 200


async def test_non_200_is_reported_by_status_without_reading_the_body(
    client: HttpGetClient, server: LoopbackServer
) -> None:
    server.routes["/health"] = respond(503, b"x" * 10_000)
    answer = await client.get(server.url + "/health", max_bytes=100)
    assert (answer.status, answer.body) == (503, b"")


async def test_a_cancelled_request_leaves_no_connection_behind(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer], server: LoopbackServer
) -> None:
    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(100):
            conn.sendall(b"x")
            time.sleep(0.02)

    server.routes["/slow"] = trickle
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await client.get(server.url + "/slow", max_bytes=2**20)
    fast = keep_alive()
    assert (await client.get(fast.url + "/metrics", max_bytes=2**20)).body == CAPTURE
    assert not any(client._idle.get(("127.0.0.1", server.port), []))


async def test_only_plain_http(client: HttpGetClient) -> None:
    with pytest.raises(ValueError, match="not an http:// URL"):
        await client.get("https://127.0.0.1:1/metrics", max_bytes=100)


async def test_sim_gpu_document_over_its_cap(client: HttpGetClient, server: LoopbackServer) -> None:
    server.routes["/sim/gpu"] = respond(body=b"[" + b"0," * 600_000 + b"0]")
    result = await SimGpuSource(fetcher=PlainHttpFetcher(client), url=server.url + "/sim/gpu", timeout_s=2).read()
    assert result.error is not None
    assert result.error.endswith("answer over 1048576 bytes")


async def test_the_request_line_is_ascii_as_httpx_sends_it(
    client: HttpGetClient, keep_alive: Callable[..., KeepAliveServer]
) -> None:
    server = keep_alive()
    answer = await client.get(server.url + "/prefix/métrics?q=a b", max_bytes=2**20)
    assert answer.status == 200
    assert server.requests == ["/prefix/m%C3%A9trics?q=a%20b"]
    result = await VllmHttpSource(
        fetcher=PlainHttpFetcher(client), base_url="http://xn--.invalid", timeout_s=2, max_body_bytes=100
    ).read()
    assert result.error is not None
    assert "\n" not in result.error
