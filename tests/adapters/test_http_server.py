"""The HTTP server on aiohttp: requests and answers, limits, streaming, stop, and clients that misbehave."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import structlog

from sidecar.exporter.server import HttpServer, Request, Response


async def _echo(request: Request) -> Response:
    if request.path == "/stream":
        return Response(status=200, body=b"first;", stream=_counting_stream())
    return Response.text(200, f"{request.method} {request.path} {len(request.body)}")


closed_streams: list[str] = []


async def _counting_stream() -> AsyncIterator[bytes]:
    try:
        for index in range(3):
            await asyncio.sleep(0.01)
            yield f"chunk{index};".encode()
    finally:
        closed_streams.append("closed")


async def _endless_stream() -> AsyncIterator[bytes]:
    try:
        while True:
            await asyncio.sleep(0.01)
            yield b"x" * 1024
    finally:
        closed_streams.append("endless closed")


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    async def handler(request: Request) -> Response:
        if request.path == "/endless":
            return Response(status=200, stream=_endless_stream())
        return await _echo(request)

    served = HttpServer(host="127.0.0.1", port=0, handler=handler, read_timeout_s=0.5, max_body_bytes=1000)
    await served.start()
    yield served
    await served.stop()


async def _raw(server: HttpServer, data: bytes, *, wait_s: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    await writer.drain()
    try:
        async with asyncio.timeout(wait_s):
            return await reader.read()
    finally:
        writer.close()


async def test_get_post_and_head(server: HttpServer) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        assert (await client.get("/a?x=1")).text == "GET /a 0\n"
        assert (await client.post("/b", content=b"12345")).text == "POST /b 5\n"
        head = await client.head("/a")
        assert head.status_code == 200
        assert head.content == b""
        assert head.headers["content-length"] == str(len("HEAD /a 0\n"))


async def test_streaming_is_chunked_and_closes_the_producer(server: HttpServer) -> None:
    closed_streams.clear()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        response = await client.get("/stream")
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.text == "first;chunk0;chunk1;chunk2;"
    assert closed_streams == ["closed"]


async def test_a_client_hanging_up_mid_stream_ends_the_producer(server: HttpServer) -> None:
    closed_streams.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await reader.read(4096)
    writer.close()
    deadline = time.monotonic() + 5
    # The producer's finally runs inside the server's task; polling the list it appends to is the simplest probe.
    while "endless closed" not in closed_streams and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert closed_streams == ["endless closed"]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nbadheader\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"400"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", b"413"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"501"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    ],
)
async def test_bad_requests_get_a_clear_status(server: HttpServer, request_bytes: bytes, status: bytes) -> None:
    answer = await _raw(server, request_bytes)
    assert answer.split(b" ", 2)[1] == status


async def test_a_silent_client_is_dropped_after_the_read_timeout(server: HttpServer) -> None:
    started = time.monotonic()
    answer = await _raw(server, b"GET / HTTP/1.1\r\n", wait_s=3.0)  # never finishes its head
    assert answer == b""
    assert time.monotonic() - started < 2.0


async def test_a_truncated_body_is_dropped(server: HttpServer) -> None:
    answer = await _raw(server, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly-this", wait_s=3.0)
    assert answer == b""


async def test_stop_ends_half_open_connections_at_once_and_leaves_no_task_to_cancel() -> None:
    handled: list[str] = []

    async def handler(request: Request) -> Response:
        handled.append(request.path)
        return Response.text(200, "ok")

    served = HttpServer(host="127.0.0.1", port=0, handler=handler, read_timeout_s=30.0)
    await served.start()
    clients = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(3)]
    for (_, writer), data in zip(
        clients, [b"", b"GET /x HTTP/1.1\r\nHost: x\r\n", b"POST /y HTTP/1.1\r\n"], strict=True
    ):
        writer.write(data)
        await writer.drain()
    await asyncio.sleep(0.2)  # the server has accepted all three and waits for the rest of each request
    before = set(asyncio.all_tasks())
    started = time.monotonic()
    await served.stop()
    assert time.monotonic() - started < 1.0  # not the 30 s read timeout
    await asyncio.sleep(0)
    leftover = [task for task in asyncio.all_tasks() - {asyncio.current_task()} if task in before and not task.done()]
    assert leftover == []  # nothing left for asyncio.run() to cancel (a cancelled handler logs a traceback on 3.11)
    for reader, writer in clients:
        assert await reader.read() == b""  # closed without an answer
        writer.close()
    assert handled == []


async def test_stop_gives_an_answer_in_progress_a_second_then_cuts_it_and_closes_the_producer(
    server: HttpServer,
) -> None:
    closed_streams.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert (await reader.read(4096)).startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    await server.stop()
    assert time.monotonic() - started < 2.5
    await asyncio.sleep(0.05)
    assert closed_streams == ["endless closed"]
    writer.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100,  # a head trickled in (slow-loris)
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"b" * 90,  # then a body trickled in
    ],
)
async def test_a_trickling_client_is_dropped_at_the_read_timeout_from_its_start(
    server: HttpServer, head: bytes
) -> None:
    """Each byte restarts no clock: the request must be in within the read timeout (0.5 s) of the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    started = time.monotonic()
    try:
        for index in range(len(head)):
            writer.write(head[index : index + 1])
            await writer.drain()
            await asyncio.sleep(0.02)
        async with asyncio.timeout(3):
            answer = await reader.read()
    except ConnectionError:
        answer = b""  # dropped while still sending
    assert answer == b""
    assert time.monotonic() - started < 2.0
    writer.close()


async def test_a_failing_handler_is_a_500_and_one_log_line_and_no_request_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request: Request) -> Response:
        if request.path == "/bug":
            raise ValueError("a bug")
        return Response.text(200, "ok")

    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        served = HttpServer(host="127.0.0.1", port=0, handler=handler, logger=structlog.get_logger())
        await served.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{served.port}") as client:
                assert (await client.get("/ok")).status_code == 200
                failed = await client.get("/bug")
            assert await _raw(served, b"NONSENSE\r\n\r\n") != b""
        finally:
            await served.stop()
    assert failed.status_code == 500
    assert failed.text == "internal server error\n"
    assert logs == [{"event": "http_handler_failed", "error": "ValueError: a bug", "log_level": "error"}]
    assert [record for record in caplog.records if record.name.startswith("aiohttp")] == []  # no access log
