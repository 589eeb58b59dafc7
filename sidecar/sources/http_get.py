"""A small HTTP/1.1 GET client on asyncio, for polling vLLM over plain http://. Does network I/O.

The sidecar asks vLLM for /metrics and /health every tick, over loopback. httpx spends more CPU per request
than parsing a 300 KB exposition does (its request and response models, anyio, the connection pool's
bookkeeping: about a millisecond a request on a small machine), so this client does only what those
polls need: GET, connections kept alive between ticks, `Accept-Encoding: identity` (a server that offers
gzip, as prometheus_client's own exposition apps do, would spend CPU compressing what the sidecar then spends
CPU undoing, over loopback), bodies framed by Content-Length, chunked or the end of the connection, gzip or
deflate still decoded should a server send them anyway, and every body counted against a cap as it arrives.
Each connection receives into one buffer of its own (sidecar.sources.http_receive), not a StreamReader.

The one exception to httpx being the sidecar's HTTP client, kept because httpx misses the tick's CPU budget
(docs/benchmarks.md). The sources reach it only through `sidecar.sources.fetch.PlainHttpFetcher`, which the
daemon picks for http:// (httpx for anything else), and tests/property/test_http_get_oracle.py fuzzes it
against httpx as its oracle: what h11 refuses in a status line, a header or a chunk size is refused here too.

Bounding time is the caller's: one `asyncio.timeout` around the whole request (a trickling server must not
outlast it); cancelled or failed, a connection is dropped, never reused. Failures raise `GetError`
subclasses with one-line reasons. https:// is not handled here: sidecar.sources.fetch hands it to httpx.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import zlib
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from sidecar import __version__
from sidecar.model.text import plural
from sidecar.sources.http_receive import ReceiveClosedError, ReceiveLimitError, Receiver

HEADER_LIMIT_BYTES = 64 * 1024  # status line and headers together; httpcore lets h11 take 100 KiB
_READ_CHUNK_BYTES = 256 * 1024
_MAX_IDLE_PER_HOST = 4
_CHUNK_LINE_LIMIT = 1024
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"  # RFC 3986 pchar and '/', '%' kept so an encoded path stays as it is
_QUERY_SAFE = _PATH_SAFE + "?"
# The grammar h11 reads answers by (h11/_abnf.py), so both clients refuse the same heads.
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: [^\x00\r\n\x0b\x0c]*)?")
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_NOT_IN_VALUES = re.compile(r"[\x00\r\n\x0b\x0c]")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,20}")
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")


class GetError(Exception):
    """The request failed; the message is one line without the URL (the caller names it)."""


class ConnectFailedError(GetError):
    def __init__(self, reason: str, *, refused: bool) -> None:
        super().__init__(reason)
        self.refused = refused  # nothing listens there (every address refused the connection)


class ConnectionDroppedError(GetError):
    """The server closed or reset the connection, or sent something that is not HTTP/1.x."""


class AnswerTooLargeError(GetError):
    def __init__(self, limit_bytes: int, declared_bytes: int | None = None) -> None:
        if declared_bytes is not None:
            super().__init__(f"answer of {declared_bytes} bytes exceeds the {limit_bytes} byte cap")
        else:
            super().__init__(f"answer exceeds the {limit_bytes} byte cap")
        self.limit_bytes = limit_bytes
        self.declared_bytes = declared_bytes


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes  # empty unless the status is 200: other answers are not read


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    request_head: bytes


class HttpGetClient:
    """GETs over plain HTTP/1.1 with keep-alive; one per daemon, closed with `aclose`."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[Receiver]] = {}
        self._targets: dict[str, _Target] = {}

    async def get(self, url: str, *, max_bytes: int) -> Answer:
        """GET `url`; the body (decoded, at most `max_bytes`) when the answer is 200, else just the status."""
        target = self._target(url)
        connection = self._take_idle(target)
        if connection is not None:
            try:
                return await self._exchange(target, connection, max_bytes, reused=True)
            except _StaleConnectionError:
                pass  # closed by the server as we reused it: a GET may be sent again, once, on a new connection
        return await self._exchange(target, await _connect(target), max_bytes, reused=False)

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                if connection.transport is not None:
                    connection.transport.close()  # idle and whole: a clean close, not a reset
        self._idle.clear()

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"not an http:// URL with a host: {url!r}")
            port = parts.port or 80
            # As httpx sends them: a path percent-encoded, a name in IDNA; the request line must be ASCII.
            path = quote(parts.path or "/", safe=_PATH_SAFE) + (
                f"?{quote(parts.query, safe=_QUERY_SAFE)}" if parts.query else ""
            )
            host = parts.hostname
            authority = f"[{host}]" if ":" in host else host.encode("idna").decode("ascii")
            authority += "" if port == 80 else f":{port}"
            head = (
                f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: vllm-sidecar/{__version__}\r\n"
                "Accept: */*\r\nAccept-Encoding: identity\r\n\r\n"
            )
            target = _Target(host=host, port=port, request_head=head.encode("ascii"))
            self._targets[url] = target
        return target

    def _take_idle(self, target: _Target) -> Receiver | None:
        idle = self._idle.get((target.host, target.port))
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            _drop(connection)
        return None

    def _give_back(self, target: _Target, connection: Receiver) -> None:
        idle = self._idle.setdefault((target.host, target.port), [])
        if len(idle) < _MAX_IDLE_PER_HOST:
            idle.append(connection)
        else:
            _drop(connection)

    async def _exchange(self, target: _Target, connection: Receiver, max_bytes: int, *, reused: bool) -> Answer:
        keep = False
        connection.clear()
        connection.busy = True
        try:
            assert connection.transport is not None  # noqa: S101 - set when the connection was made
            connection.transport.write(target.request_head)
            status, headers, keep_alive = await _read_head(connection, reused=reused)
            if status != 200:
                return Answer(status=status, body=b"")
            body, framed = await _read_body(connection, headers, max_bytes)
            keep = keep_alive and framed
            return Answer(status=status, body=_decoded(body, headers.get("content-encoding"), max_bytes))
        finally:
            connection.busy = False
            if keep and connection.usable():
                self._give_back(target, connection)
            else:
                _drop(connection)


class _StaleConnectionError(GetError):
    """A reused connection was closed before any byte of the answer: safe to send the GET again."""


def _drop(connection: Receiver) -> None:
    if connection.transport is not None:
        connection.transport.abort()


async def _connect(target: _Target) -> Receiver:
    hosts = [target.host]
    try:
        ipaddress.ip_address(target.host)
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as error:  # socket.gaierror: the name does not resolve
            raise ConnectFailedError(_reason(error), refused=False) from None
        hosts = list(dict.fromkeys(str(info[4][0]) for info in infos))
    errors: list[OSError] = []
    loop = asyncio.get_running_loop()
    for host in hosts:
        try:
            _, connection = await loop.create_connection(Receiver, host, target.port)
        except OSError as error:
            errors.append(error)
            continue
        return connection
    refused = bool(errors) and all(isinstance(error, ConnectionRefusedError) for error in errors)
    raise ConnectFailedError("connection refused" if refused else _reason(errors[-1]), refused=refused)


def _reason(error: BaseException) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


async def _read_head(connection: Receiver, *, reused: bool) -> tuple[int, dict[str, str], bool]:
    """The status, the headers (names lower-cased, repeated ones joined with ','), and whether to keep alive.

    What h11 (httpx) refuses is refused here too, whatever the status: a status line that is not
    `HTTP/1.x NNN reason`, a field name that is not a token, NUL/CR/LF/VT/FF in a value, a Content-Length that
    is not one number (`5, 5` is one), a Transfer-Encoding other than `chunked` (tests/property/
    test_http_get_oracle.py holds the two to the same answers).
    """
    try:
        raw = await connection.read_until(b"\r\n\r\n", HEADER_LIMIT_BYTES)
    except ReceiveClosedError as closed:
        if reused and closed.received == 0:
            raise _StaleConnectionError("closed before answering") from None
        if closed.cause is not None:
            raise ConnectionDroppedError(_reason(closed.cause)) from None
        raise ConnectionDroppedError("closed before a complete status line and headers") from None
    except ReceiveLimitError:
        raise ConnectionDroppedError(f"status line and headers longer than {HEADER_LIMIT_BYTES} bytes") from None
    lines = raw[:-4].decode("latin-1").split("\r\n")
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None:
        raise ConnectionDroppedError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        value = value.strip(" \t")  # only SP and HTAB are whitespace here (str.strip would take NBSP too)
        if not colon or _TOKEN.fullmatch(name) is None or _NOT_IN_VALUES.search(value) is not None:
            raise ConnectionDroppedError(f"malformed header line: {line[:80]!r}")
        key = name.lower()
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    length = _content_length(headers)
    if length is not None:
        headers["content-length"] = length  # "5, 5" (the line repeated) states one length: the body reads it
    connection_tokens = {token.strip(" \t").lower() for token in headers.get("connection", "").split(",")}
    keep_alive = "close" not in connection_tokens and (status[1] == "1" or "keep-alive" in connection_tokens)
    return int(status[2]), headers, keep_alive


def _content_length(headers: dict[str, str]) -> str | None:
    """The one Content-Length the head states, if any; what would frame the body ambiguously is refused, as h11
    refuses it before any body is read."""
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.lower() != "chunked":  # "gzip, chunked", or two lines of it
        raise ConnectionDroppedError(f"unsupported Transfer-Encoding {coding[:40]!r}")
    declared = headers.get("content-length")
    if declared is not None:
        values = {value.strip(" \t") for value in declared.split(",")}  # repeated lines were joined by ','
        if len(values) != 1 or _CONTENT_LENGTH.fullmatch(next(iter(values))) is None:
            raise ConnectionDroppedError(f"invalid Content-Length {declared[:40]!r}")
        return values.pop()
    return None


async def _read_body(connection: Receiver, headers: dict[str, str], max_bytes: int) -> tuple[bytes, bool]:
    """The raw body and whether its end was framed (so the connection can carry another request)."""
    try:
        if "transfer-encoding" in headers:  # "chunked": _content_length refused anything else
            return await _read_chunked(connection, max_bytes), True
        declared = headers.get("content-length")
        if declared is not None:
            length = int(declared)  # checked and made one number by _content_length
            if length > max_bytes:
                raise AnswerTooLargeError(max_bytes, declared_bytes=length)
            return await connection.read_exactly(length), True
        return await _read_to_end(connection, max_bytes), False
    except ReceiveClosedError as closed:
        if closed.cause is not None:
            raise ConnectionDroppedError(_reason(closed.cause)) from None
        got = (
            plural(closed.received, "byte")
            if closed.expected is None
            else f"{closed.received} of {closed.expected} bytes"
        )
        raise ConnectionDroppedError(f"closed after {got} of the body") from None
    except ReceiveLimitError:
        raise ConnectionDroppedError("chunk size line too long") from None


async def _read_chunked(connection: Receiver, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        line = await connection.read_until(b"\r\n", _CHUNK_LINE_LIMIT)
        header = _CHUNK_SIZE_LINE.fullmatch(line, 0, len(line) - 2)  # not int(): it takes "0x1a", "+5", "1_0"
        if header is None:
            raise ConnectionDroppedError(f"invalid chunk size line {line[:-2][:20]!r}")
        length = int(header[1], 16)
        if length == 0:
            while await connection.read_until(b"\r\n", _CHUNK_LINE_LIMIT) != b"\r\n":  # trailers, then a blank
                pass
            return b"".join(chunks)
        size += length
        if size > max_bytes:
            raise AnswerTooLargeError(max_bytes)
        data = await connection.read_exactly(length + 2)
        if data[-2:] != b"\r\n":
            raise ConnectionDroppedError("chunk not followed by CRLF")
        chunks.append(data[:-2])


async def _read_to_end(connection: Receiver, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await connection.read_some(_READ_CHUNK_BYTES):
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLargeError(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _decoded(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body with its Content-Encoding undone, still at most `max_bytes` (a small gzip can hold a lot)."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return body
    name = encoding.strip().lower()
    if name in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif name == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise ConnectionDroppedError(f"unsupported Content-Encoding {encoding[:40]!r}")
    decompressor = zlib.decompressobj(wbits)
    try:
        decoded = decompressor.decompress(body, max_bytes + 1)
    except zlib.error as error:
        if name != "deflate":
            raise ConnectionDroppedError(f"undecodable {name} body: {error}") from None
        # Some servers send raw deflate without the zlib wrapper; httpx accepts both, and so does this.
        decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            decoded = decompressor.decompress(body, max_bytes + 1)
        except zlib.error as raw_error:
            raise ConnectionDroppedError(f"undecodable {name} body: {raw_error}") from None
    if len(decoded) > max_bytes or decompressor.unconsumed_tail:
        raise AnswerTooLargeError(max_bytes)
    if not decompressor.eof:
        raise ConnectionDroppedError(f"truncated {name} body")
    return decoded
