"""A small HTTP/1.1 server on asyncio streams for the daemon's endpoints. Does network I/O.

The daemon answers a handful of tiny requests from probes and Prometheus, so it needs no framework:
one request per connection, bounded header size, header count, body size and read time, and a bounded
number of connections at once, so a slow or hostile client costs a socket and a few KiB for a few seconds
at most and never blocks the tick. With an `ssl.SSLContext` it serves HTTPS (the handshake bounded by the
same read timeout); a client speaking plain HTTP to it only gets its connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

MAX_HEADER_BYTES = 16 * 1024
MAX_HEADER_FIELDS = 100  # what h11 and most servers allow; real clients send under 20
MAX_BODY_BYTES = 64 * 1024
READ_TIMEOUT_S = 5.0
# Connections the daemon serves at once: each holds at most a head and a body for at most the read timeout,
# so this bounds memory (about 80 KiB each) and descriptors under a flood. Probes and scrapes need a handful.
# (The simulator streams to hundreds of load-test clients and sets no cap.)
DAEMON_MAX_CONNECTIONS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    peer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[bytes] | None = None  # sent chunked after `body`, e.g. server-sent events

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status=status, body=(text.rstrip("\n") + "\n").encode())


Handler = Callable[[Request], Awaitable[Response]]


class BadRequestError(Exception):
    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class HttpServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        handler: Handler,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_connections: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._handler = handler
        self._read_timeout_s = read_timeout_s
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._connections = 0
        # Connections being served, with their handler tasks, so stop() can end them and wait for the handlers.
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None] | None] = {}
        self._answering: set[asyncio.StreamWriter] = set()  # those whose request was read
        self._tls = tls
        self._server: asyncio.Server | None = None

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            host=self._host or None,
            port=self._port,
            limit=MAX_HEADER_BYTES,
            reuse_address=True,
            ssl=self._tls,
            # asyncio's default is 60 s: a client that opens a connection and sends nothing would hold it that long.
            ssl_handshake_timeout=self._read_timeout_s if self._tls is not None else None,
        )

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and end the connections still open (a half-sent request, a slow reader): each
        handler sees its connection gone and returns, so none is left for the event loop's end to cancel."""
        if self._server is not None:
            self._server.close()
            open_now = dict(self._open)
            for writer in open_now:
                if writer not in self._answering:
                    writer.transport.abort()  # nothing owed to a client that has not finished its request
            handlers = {task for task in open_now.values() if task is not None and task is not asyncio.current_task()}
            # An answer being written gets a second to go out (a stream never ends by itself); then its
            # connection is cut too, and its handler returns within a few loop turns.
            if handlers:
                _, late = await asyncio.wait(handlers, timeout=1.0)
                for writer, task in open_now.items():
                    if task in late:
                        writer.transport.abort()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._max_connections is not None and self._connections >= self._max_connections:
            writer.transport.abort()  # over the cap: dropped at once, costing nothing while the flood lasts
            return
        self._connections += 1
        self._open[writer] = asyncio.current_task()
        try:
            await self._serve_one(reader, writer)
        except asyncio.CancelledError:
            # Cancelled from outside (the event loop's end cancels what is left): the connection just ends.
            # Nothing awaits this task, and Python 3.11's asyncio.streams logs a handler task that ends
            # cancelled as an error with a traceback (fixed in 3.12), so it must end quietly instead.
            writer.transport.abort()
        finally:
            self._open.pop(writer, None)
            self._answering.discard(writer)
            self._connections -= 1

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        try:
            try:
                async with asyncio.timeout(self._read_timeout_s):
                    request = await _read_request(reader, peer, self._max_body_bytes)
            except BadRequestError as error:
                response = Response.text(error.status, str(error))
                method = "GET"
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            else:
                self._answering.add(writer)
                response = await self._handler(request)
                method = request.method
            writer.write(_encode(response, head_only=method == "HEAD"))
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(self._read_timeout_s):
                    await writer.drain()
                if response.stream is not None and method != "HEAD":
                    await self._send_stream(writer, response.stream)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _send_stream(self, writer: asyncio.StreamWriter, stream: AsyncIterator[bytes]) -> None:
        """Chunked transfer of `stream`; a client that hangs up ends it (the producer sees GeneratorExit)."""
        try:
            async for chunk in stream:
                if chunk:
                    writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    async with asyncio.timeout(self._read_timeout_s):
                        await writer.drain()
            writer.write(b"0\r\n\r\n")
            async with asyncio.timeout(self._read_timeout_s):
                await writer.drain()
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def _read_request(reader: asyncio.StreamReader, peer: str, max_body_bytes: int) -> Request:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequestError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    if len(lines) > MAX_HEADER_FIELDS + 3:  # the request line and the two empty lines that end the head
        raise BadRequestError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"over {MAX_HEADER_FIELDS} header fields")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequestError(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target = parts[0], parts[1]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, separator, value = line.partition(":")
        if not separator:
            raise BadRequestError(HTTPStatus.BAD_REQUEST, "malformed header line")
        # Only SP and HTAB surround a value (RFC 9110 5.5): str.strip() would also eat bytes 0x85 and 0xa0,
        # which are the end of UTF-8 characters in a token ("à" is c3 a0).
        headers[name.strip().lower()] = value.strip(" \t")
    if "transfer-encoding" in headers:
        raise BadRequestError(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies are not accepted")
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()):  # "²".isdigit() too, and int() refuses it
        raise BadRequestError(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
    length = int(length_text)
    if length > max_body_bytes:
        raise BadRequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {max_body_bytes} bytes")
    body = await reader.readexactly(length) if length else b""
    path = target.split("?", 1)[0]
    return Request(method=method, path=path, headers=headers, body=body, peer=peer)


def _encode(response: Response, *, head_only: bool) -> bytes:
    reason = HTTPStatus(response.status).phrase
    length = (
        {"Transfer-Encoding": "chunked"} if response.stream is not None else {"Content-Length": str(len(response.body))}
    )
    headers = {
        "Content-Type": response.content_type,
        **length,
        "Connection": "close",
        "Cache-Control": "no-store",
        **response.headers,
    }
    head = f"HTTP/1.1 {response.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    body = b"" if head_only else response.body
    if response.stream is not None and body:
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n"
    return head.encode("latin-1") + b"\r\n" + body


def _peer(writer: asyncio.StreamWriter) -> str:
    address = writer.get_extra_info("peername")
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
