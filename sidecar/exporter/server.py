"""Serves a `Handler` over HTTP/1.1 with aiohttp's low-level server, within fixed bounds. Does network I/O.

aiohttp parses and writes HTTP; this module adapts its requests to the small `Request`/`Response` the
daemon's endpoints, the simulator and the demo's control speak, and adds what aiohttp leaves to its user:
- a deadline for the whole request: aiohttp's `keepalive_timeout` already closes a connection whose first
  head has not arrived in time (a silent or trickling client), the body is read here against the same
  deadline, counted from the connection's start, and a TLS handshake is bounded by it too;
- a cap on connections served at once (`max_connections`): those over it are dropped at once;
- the status of a refused head: aiohttp answers 400 to all, here a head over its limits is a 431, a body
  over the cap a 413 (from Content-Length, before it is read), a chunked body a 501;
- no access log, and no traceback for a client's bad request: one structlog line per handler failure;
- a stop that ends half-sent requests at once and gives an answer being written a second.
One request per connection (`Connection: close`); a stream (server-sent events) is sent chunked and a
client that hangs up ends its producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from structlog.typing import FilteringBoundLogger

MAX_HEADER_LINE_BYTES = 8190  # request line, and each header field (aiohttp's default; a 4 KiB token fits)
MAX_HEADER_FIELDS = 100  # what h11 and most servers allow; real clients send under 20
MAX_BODY_BYTES = 64 * 1024
READ_TIMEOUT_S = 5.0
# Connections the daemon serves at once: each holds at most a head and a body for at most the read timeout,
# so this bounds memory and descriptors under a flood. Probes and scrapes need a handful.
# (The simulator streams to hundreds of load-test clients and sets no cap.)
DAEMON_MAX_CONNECTIONS = 256
STOP_GRACE_S = 1.0  # what an answer being written gets at stop before its connection is cut
LINGER_S = 1.0  # aiohttp reads and drops an unread body this long before closing, so its client sees the answer


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased, values as latin-1 (the bytes the client sent)
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


class _RefusedError(Exception):
    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _Protocol(web.RequestHandler):
    """aiohttp's connection protocol, within the cap, with the start of the request's deadline, and with our
    status and silence for a head aiohttp refuses."""

    def __init__(self, manager: _Manager, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._owner = manager
        self._log = manager.logger
        self.started_s = 0.0
        self.received_any = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # aiohttp's count of connections being served (a refused one is never in it): over the cap, a
        # connection is dropped at once, costing nothing while the flood lasts.
        limit = self._owner.max_connections
        if limit is not None and len(self._owner.connections) >= limit and isinstance(transport, asyncio.Transport):
            transport.abort()  # aiohttp's connection_lost, which follows, copes with a connection never made
            return
        self.started_s = asyncio.get_running_loop().time()  # after a TLS handshake: that had its own bound
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        super().data_received(data)

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's contract: True keeps the transport
        """A client that half-closes after sending its request still gets the answer: asyncio closes the
        transport unless this says to keep it (over TLS it cannot, and warns if asked). One that sent nothing
        is gone; one whose request is incomplete waits for nothing but its deadline."""
        super().eof_received()
        plain = self.transport is not None and self.transport.get_extra_info("sslcontext") is None
        return self.received_any and plain

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer to a head aiohttp refused (or a handler that failed), without aiohttp's traceback."""
        del message  # aiohttp's text quotes what the client sent; the answer names the rule instead
        if request.writer.output_size > 0:  # as aiohttp does: an answer is under way, no second one fits
            raise ConnectionError("an answer was under way; the connection is closed")
        reason = "bad request"
        if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)):
            status, reason = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"
        elif status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            reason = HTTPStatus(status).phrase.lower()
            if self._log is not None and exc is not None:
                self._log.error("http_handler_failed", error=f"{type(exc).__name__}: {exc}")
        return _plain(status, reason)

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp reports an unexpected failure with a traceback; here it is one line."""
        del args
        exc = kwargs.get("exc_info")
        if self._log is not None and isinstance(exc, BaseException):
            self._log.error("http_connection_failed", error=f"{type(exc).__name__}: {exc}")


class _Manager(web.Server):
    """aiohttp's connection manager, handing each connection our protocol."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        max_connections: int | None,
        logger: FilteringBoundLogger | None,
        **protocol_kwargs: Any,
    ) -> None:
        super().__init__(handler, **protocol_kwargs)
        self.max_connections = max_connections
        self.logger = logger
        self._protocol_kwargs = {"loop": asyncio.get_running_loop(), **protocol_kwargs}

    def __call__(self) -> web.RequestHandler:
        return _Protocol(self, **self._protocol_kwargs)


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
        logger: FilteringBoundLogger | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._handler = handler
        self._read_timeout_s = read_timeout_s
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._tls = tls
        self._log = logger
        # Requests being served (the handling task, its connection): those whose body is being read, those answered.
        self._reading: dict[asyncio.Task[Any], asyncio.Transport] = {}
        self._answering: dict[asyncio.Task[Any], asyncio.Transport] = {}
        self._manager: _Manager | None = None
        self._listener: asyncio.Server | None = None

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    async def start(self) -> None:
        self._manager = _Manager(
            self._serve,
            max_connections=self._max_connections,
            logger=self._log,
            access_log=None,  # a line per request would drown the daemon's one line per change
            # Closes a connection whose request head has not arrived this long after it opened.
            keepalive_timeout=self._read_timeout_s,
            lingering_time=min(LINGER_S, self._read_timeout_s),
            max_line_size=MAX_HEADER_LINE_BYTES,
            max_field_size=MAX_HEADER_LINE_BYTES,
            max_headers=MAX_HEADER_FIELDS,
            auto_decompress=False,  # bodies are read as sent: a compressed one cannot grow past the cap
        )
        self._listener = await asyncio.get_running_loop().create_server(
            self._manager,
            host=self._host or None,
            port=self._port,
            reuse_address=True,
            ssl=self._tls,
            # asyncio's default is 60 s: a client that opens a connection and sends nothing would hold it that long.
            ssl_handshake_timeout=self._read_timeout_s if self._tls is not None else None,
        )

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._listener is None or not self._listener.sockets:
            raise RuntimeError("server not started")
        return int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and end the connections still open: a half-sent request is cut at once, an answer
        being written gets a second (a stream never ends by itself), then its connection is cut too."""
        if self._listener is None or self._manager is None:
            return
        self._listener.close()
        for transport in self._reading.values():
            transport.abort()  # nothing owed to a client that has not finished its request
        answering = {task for task in self._answering if task is not asyncio.current_task()}
        if answering:
            _, late = await asyncio.wait(answering, timeout=STOP_GRACE_S)
            for task in late:
                self._answering[task].abort()  # its next write fails and the handler returns
        self._manager.pre_shutdown()
        await self._manager.shutdown(STOP_GRACE_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await self._listener.wait_closed()
        self._listener = None
        self._manager = None

    async def _serve(self, raw: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        transport = raw.transport
        if task is None or transport is None:  # the client is already gone
            return _plain(HTTPStatus.BAD_REQUEST, "connection closed")
        self._reading[task] = transport
        try:
            request = await self._read(raw, transport)
        except _RefusedError as refusal:
            return _plain(refusal.status, str(refusal))
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, web.RequestPayloadError):
            transport.abort()  # too slow, or gone mid-body: no answer is owed
            return _plain(HTTPStatus.REQUEST_TIMEOUT, "request not received in time")
        finally:
            self._reading.pop(task, None)
        self._answering[task] = transport
        try:
            response = await self._handler(request)
            return await self._send(raw, response)
        finally:
            self._answering.pop(task, None)

    async def _read(self, raw: web.BaseRequest, transport: asyncio.Transport) -> Request:
        if "Transfer-Encoding" in raw.headers:
            raise _RefusedError(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies are not accepted")
        length = raw.content_length or 0
        if length > self._max_body_bytes:
            raise _RefusedError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {self._max_body_bytes} bytes")
        started_s = raw.protocol.started_s if isinstance(raw.protocol, _Protocol) else asyncio.get_running_loop().time()
        body = b""
        if length:
            async with asyncio.timeout_at(started_s + self._read_timeout_s):
                body = await raw.content.readexactly(length)
        return Request(
            method=raw.method,
            path=raw.raw_path.partition("?")[0],  # the target as sent, without its query
            # As latin-1, so a header's str encodes back to the bytes sent (the admin token compares bytes).
            headers={name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw.raw_headers},
            body=body,
            peer=_peer(transport),
        )

    async def _send(self, raw: web.BaseRequest, response: Response) -> web.StreamResponse:
        headers = {"Content-Type": response.content_type, **_COMMON_HEADERS, **response.headers}
        if response.stream is None:
            answer = web.Response(status=response.status, body=response.body, headers=headers)
            answer.force_close()
            return answer
        streamed = web.StreamResponse(status=response.status, headers=headers)
        streamed.force_close()
        streamed.enable_chunked_encoding()
        try:
            async with asyncio.timeout(self._read_timeout_s):
                await streamed.prepare(raw)
                if response.body:
                    await streamed.write(response.body)
            if raw.method != "HEAD":
                await self._send_stream(streamed, response.stream)
        except (ConnectionError, TimeoutError):
            pass  # the client hung up or stopped reading: the connection ends with the stream
        finally:
            aclose = getattr(response.stream, "aclose", None)
            if aclose is not None:
                await aclose()  # a client that hung up ends the producer (it sees GeneratorExit)
        return streamed

    async def _send_stream(self, streamed: web.StreamResponse, stream: AsyncIterator[bytes]) -> None:
        async for chunk in stream:
            if chunk:
                async with asyncio.timeout(self._read_timeout_s):  # a client that stopped reading
                    await streamed.write(chunk)
        async with asyncio.timeout(self._read_timeout_s):
            await streamed.write_eof()


_COMMON_HEADERS = {
    "Connection": "close",
    "Cache-Control": "no-store",
    "Server": "vllm-sidecar",  # not aiohttp's default, which names its version
}


def _plain(status: int, reason: str) -> web.Response:
    answer = web.Response(
        status=status,
        body=(reason + "\n").encode(),
        headers={"Content-Type": "text/plain; charset=utf-8", **_COMMON_HEADERS},
    )
    answer.force_close()
    return answer


def _peer(transport: asyncio.Transport) -> str:
    address = transport.get_extra_info("peername")
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
