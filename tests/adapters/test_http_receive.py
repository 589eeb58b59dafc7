"""The receive buffer under the small HTTP client (sidecar.sources.http_receive), on real loopback sockets.

What the client tests (test_http_get) do not show directly: reads that span the buffer moving (a delimiter
split across arrivals, a body bigger than the buffer was), a buffer that stops growing once it fits an answer,
flow control against a server that sends more than was asked for, and bytes nobody asked for.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

from sidecar.sources.http_get import HttpGetClient
from sidecar.sources.http_receive import (
    HIGH_WATER_BYTES,
    MIN_FREE_BYTES,
    ReceiveClosedError,
    ReceiveLimitError,
    Receiver,
)
from tests.loopback import LoopbackServer, respond, until

Script = Callable[[socket.socket], None]


async def _connected(script: Script) -> tuple[Receiver, socket.socket]:
    """A Receiver on one end of a real TCP connection; `script` drives the other end in a thread."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = asyncio.get_running_loop().run_in_executor(None, listener.accept)
    _, receiver = await asyncio.get_running_loop().create_connection(Receiver, "127.0.0.1", port)
    peer, _ = await accepted
    listener.close()
    receiver.busy = True
    asyncio.get_running_loop().run_in_executor(None, script, peer)
    return receiver, peer


def _trickle(*parts: bytes, pause_s: float = 0.01, close: bool = True) -> Script:
    def send(peer: socket.socket) -> None:
        for part in parts:
            peer.sendall(part)
            time.sleep(pause_s)
        if close:
            peer.shutdown(socket.SHUT_RDWR)

    return send


async def test_a_delimiter_split_across_arrivals_is_found_and_what_follows_is_kept() -> None:
    receiver, _ = await _connected(_trickle(b"HTTP/1.1 200 OK\r", b"\nA: b\r\n\r", b"\nbody", b"more"))
    assert await receiver.read_until(b"\r\n\r\n", 1000) == b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n"
    assert await receiver.read_exactly(8) == b"bodymore"
    with pytest.raises(ReceiveClosedError) as closed:
        await receiver.read_exactly(1)
    assert (closed.value.received, closed.value.expected, closed.value.cause) == (0, 1, None)


async def test_a_body_bigger_than_the_buffer_arrives_whole_while_the_buffer_moves() -> None:
    head = b"x" * 1000 + b"\r\n"
    body = bytes(range(256)) * 4096  # 1 MiB, sixteen times the buffer's first size
    receiver, _ = await _connected(_trickle(head, body[:300_000], body[300_000:], pause_s=0.02))
    assert await receiver.read_until(b"\r\n", 2000) == head
    assert await receiver.read_exactly(len(body)) == body


async def test_a_delimiter_beyond_the_limit_is_refused() -> None:
    receiver, _ = await _connected(_trickle(b"a" * 5000, b"\r\n"))
    with pytest.raises(ReceiveLimitError):
        await receiver.read_until(b"\r\n", 4096)


async def test_a_server_sending_more_than_was_asked_for_is_paused_not_buffered() -> None:
    flood = b"z" * (8 * 2**20)

    def send(peer: socket.socket) -> None:
        try:
            peer.sendall(flood)
        except OSError:
            return

    receiver, peer = await _connected(send)
    assert await receiver.read_exactly(10) == b"z" * 10
    await asyncio.sleep(0.5)  # the server keeps sending; nobody reads
    assert len(receiver._buffer) <= HIGH_WATER_BYTES + 2 * MIN_FREE_BYTES + 10
    assert receiver._paused
    assert await receiver.read_some(100_000) == b"z" * 100_000  # reading on resumes the flow
    assert receiver.transport is not None
    receiver.transport.abort()  # the sender's blocked sendall fails, and its thread ends
    await asyncio.sleep(0.1)
    peer.close()


async def test_bytes_nobody_asked_for_make_a_connection_unusable_and_close_it() -> None:
    idle, sent = threading.Event(), threading.Event()

    def late_after_idle(peer: socket.socket) -> None:
        peer.sendall(b"ok")
        idle.wait(10)
        peer.sendall(b"late")
        sent.set()

    loop = asyncio.get_running_loop()
    receiver, peer = await _connected(late_after_idle)
    assert await receiver.read_exactly(2) == b"ok"
    receiver.busy = False  # the answer is read: the connection is idle, as between two polls
    assert receiver.usable()
    idle.set()  # only now does "late" go out: it arrives while idle, however slow the machine
    assert await loop.run_in_executor(None, sent.wait, 10)
    # The loop reads what arrived on one of its next turns.
    await until(lambda: not receiver.usable(), 10, "the idle connection to notice the stray bytes")
    assert receiver.transport is not None
    assert receiver.transport.is_closing()
    peer.close()


@pytest.fixture
async def client() -> AsyncIterator[HttpGetClient]:
    shared = HttpGetClient()
    yield shared
    await shared.aclose()


async def test_polling_the_same_answer_stops_growing_the_buffer(client: HttpGetClient, server: LoopbackServer) -> None:
    body = b"vllm:x 1\n" * 35_000  # about 300 KB, as a 4-engine exposition

    def keep_alive(conn: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)
        data = b""
        while True:  # answer every further request on this connection the same way
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
            while b"\r\n\r\n" in data:
                _, _, data = data.partition(b"\r\n\r\n")
                conn.sendall(head + body)

    server.routes["/metrics"] = keep_alive
    sizes = []
    for _ in range(8):
        assert (await client.get(server.url + "/metrics", max_bytes=2**20)).body == body
        (connection,) = client._idle[("127.0.0.1", server.port)]
        sizes.append(len(connection._buffer))
    # Reused, never more than one answer and one read's room, however many polls: how far it grows depends on
    # how much arrived before the head was read (one read's room at a time until then; 315,000 or 380,493 bytes
    # seen in CI), but a buffer that kept growing with every poll would be over this bound within two polls.
    answer_bytes = len(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n") + len(body)
    assert sizes == sorted(sizes), sizes
    assert sizes[-1] <= answer_bytes + MIN_FREE_BYTES, sizes
    assert server.hits == ["/metrics"]  # one connection carried all eight


async def test_an_answer_followed_by_stray_bytes_is_read_and_its_connection_not_kept(
    client: HttpGetClient, server: LoopbackServer
) -> None:
    def stray(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
        time.sleep(0.2)

    server.routes["/metrics"] = stray
    assert (await client.get(server.url + "/metrics", max_bytes=100)).body == b"ok"
    assert not client._idle.get(("127.0.0.1", server.port))
    server.routes["/metrics"] = respond(body=b"again")
    assert (await client.get(server.url + "/metrics", max_bytes=100)).body == b"again"
