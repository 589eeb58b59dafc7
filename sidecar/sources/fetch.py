"""One way for the sources to GET a body: `BodyFetcher`, over httpx or over the sidecar's own plain-http client.
Does network I/O.

The vLLM source and the simulated-GPU source ask for a URL and want its body, bounded in size, or one reason it
could not be had. Two clients can do that: httpx (https://, and anything else), and for plain http:// the small
client of `sidecar.sources.http_get`, kept because httpx costs more CPU per poll than the tick's budget allows
(measured in docs/benchmarks.md) and fuzzed against httpx as its oracle (tests/property/test_http_get_oracle.py).
Each implementation here turns its own client's failures into one `FetchFailedError` exactly once, so the sources
word their error lines once and never ask which client they hold.

Bounding time is the caller's: one `asyncio.timeout` around the whole request (httpx's timeouts apply per
phase, and a server trickling bytes would never trip them); `TimeoutError` passes through untouched.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

import httpx

from sidecar.body_cap import BodyTooLargeError, read_capped
from sidecar.sources.http_get import AnswerTooLargeError, ConnectFailedError, GetError, HttpGetClient


class Failure(StrEnum):
    CONNECT = "connect"  # no connection (refused, unresolvable, unreachable): nothing answered
    DROPPED = "dropped"  # the connection closed or reset mid-answer, or what came back is not HTTP/1.x
    FAILED = "failed"  # any other failure of the client (httpx's other errors: a decoding error, ...)
    STATUS = "status"  # an answer other than 200; its body is not read
    TOO_LARGE = "too_large"  # the body (declared or counted) is over the cap
    BAD_URL = "bad_url"  # a URL no request can be made for (a host name IDNA refuses)


class FetchFailedError(Exception):
    """A GET failed. The message is one line without the URL (the source names it and what it was asking)."""

    def __init__(
        self,
        failure: Failure,
        reason: str,
        *,
        refused: bool = False,
        status: int | None = None,
        client_error: str = "ReadError",
    ) -> None:
        super().__init__(reason)
        self.failure = failure
        self.refused = refused  # nothing listens there: the process is gone, not failing
        self.status = status  # the HTTP status of an answer that was not 200; None when nothing answered
        # The name httpx gives this failure's exception ("ConnectError", "ReadError", ...): the simulated-GPU
        # source's lines name it, and read the same through either client.
        self.client_error = client_error


class BodyFetcher(Protocol):
    async def get(self, url: str, *, max_bytes: int) -> bytes:
        """The body of a 200 answer to GET `url`, at most `max_bytes` (decoded); else `FetchFailedError`."""
        ...

    async def aclose(self) -> None:
        """Release what this fetcher owns (a client handed to it stays open: its owner closes it)."""
        ...


class HttpxFetcher:
    """Over an `httpx.AsyncClient` the caller owns (shared with the webhooks and the engine probe)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def get(self, url: str, *, max_bytes: int) -> bytes:
        try:
            # Streamed and counted: `get` would hold a runaway answer whole before any size check.
            async with self._client.stream("GET", url) as response:
                if response.status_code != httpx.codes.OK:
                    raise FetchFailedError(
                        Failure.STATUS, f"answered HTTP {response.status_code}", status=response.status_code
                    )
                declared = response.headers.get("content-length")
                chunked = "transfer-encoding" in response.headers  # chunks frame the body: a length means nothing
                if declared is not None and not chunked and declared.isdigit() and int(declared) > max_bytes:
                    raise FetchFailedError(
                        Failure.TOO_LARGE, f"answer of {int(declared)} bytes exceeds the {max_bytes} byte cap"
                    )
                try:
                    return await read_capped(response, max_bytes)
                except BodyTooLargeError as error:
                    raise FetchFailedError(Failure.TOO_LARGE, str(error)) from None
        except httpx.ConnectError as error:
            reason = connection_error_reason(error)
            raise FetchFailedError(
                Failure.CONNECT, reason, refused=reason == "connection refused", client_error=type(error).__name__
            ) from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as error:
            raise FetchFailedError(
                Failure.DROPPED, connection_error_reason(error), client_error=type(error).__name__
            ) from None
        except httpx.HTTPError as error:
            name = type(error).__name__
            raise FetchFailedError(
                Failure.FAILED, f"{name}: {connection_error_reason(error)}", client_error=name
            ) from None
        except (httpx.InvalidURL, UnicodeError) as error:  # not HTTPErrors: a URL httpx cannot parse, a host
            # name IDNA refuses ("xn--": idna.IDNAError, a UnicodeError, escapes httpx unwrapped)
            raise FetchFailedError(Failure.BAD_URL, str(error), client_error=type(error).__name__) from None

    async def aclose(self) -> None:
        """Nothing: the client is the caller's, and other parts of the daemon use it too."""


class PlainHttpFetcher:
    """Over the sidecar's own plain-http client, which this fetcher owns and closes."""

    def __init__(self, client: HttpGetClient | None = None) -> None:
        self._client = client if client is not None else HttpGetClient()

    async def get(self, url: str, *, max_bytes: int) -> bytes:
        try:
            answer = await self._client.get(url, max_bytes=max_bytes)
        except ConnectFailedError as error:
            raise FetchFailedError(
                Failure.CONNECT, str(error), refused=error.refused, client_error="ConnectError"
            ) from None
        except AnswerTooLargeError as error:
            raise FetchFailedError(Failure.TOO_LARGE, str(error)) from None
        except GetError as error:  # closed, reset, or not HTTP/1.x: what httpx calls a ReadError
            raise FetchFailedError(Failure.DROPPED, str(error), client_error="ReadError") from None
        except ValueError as error:  # a URL no request line can carry (a host name IDNA refuses)
            raise FetchFailedError(Failure.BAD_URL, str(error), client_error=type(error).__name__) from None
        if answer.status != httpx.codes.OK:
            raise FetchFailedError(Failure.STATUS, f"answered HTTP {answer.status}", status=answer.status)
        return answer.body

    async def aclose(self) -> None:
        await self._client.aclose()


def connection_error_reason(error: BaseException) -> str:
    """The most specific cause: httpx wraps the OS error ("connection refused") in a generic message."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
