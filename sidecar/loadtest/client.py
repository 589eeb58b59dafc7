"""Sends one request of the load test over a streaming httpx connection and times it. Does network I/O.

Never retries and never raises: every request ends as one `RequestResult`, a success or one failure kind.
The whole request is bounded by one deadline (httpx's timeouts apply per phase, and a server trickling
tokens would never trip them). Time to first token is taken at the first chunk that carries text.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from sidecar.loadtest.result import FailureKind, RequestResult
from sidecar.loadtest.spec import Api, PlannedRequest
from sidecar.loadtest.sse import SseLines, StreamError, StreamReader, Usage, error_message, read_whole_answer

ERROR_BODY_BYTES = 64 * 1024  # enough for any error message; the rest of an error page is not read
WHOLE_ANSWER_BYTES = 64 * 2**20  # a server that ignores "stream" sends the whole answer at once
_CLIENT_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.EADDRNOTAVAIL})
DRAIN_S = 1.0  # after data: [DONE], how long the end of the HTTP body may take before the socket is dropped
SHARD_CONNECTIONS = 16
# vLLM (uvicorn) closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default. A client that keeps
# an idle connection as long races that close, and a request sent as the server closes is lost ("server
# disconnected without sending a response"): idle connections are dropped well before the server's close.
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where and how to send: the server, its API, the model."""

    base_url: str
    api: Api
    model: str
    timeout_s: float
    api_key: str | None = None

    @property
    def endpoint(self) -> str:
        path = "/v1/chat/completions" if self.api is Api.CHAT else "/v1/completions"
        return self.base_url.rstrip("/") + path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, planned: PlannedRequest) -> dict[str, Any]:
        """The request body: streamed, with usage, and ignore_eos so the output has the requested length."""
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": planned.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if self.api is Api.CHAT:
            return {**common, "messages": [{"role": "user", "content": planned.prompt}]}
        return {**common, "prompt": planned.prompt}


class ClientShards:
    """httpx clients for the requests in flight, `SHARD_CONNECTIONS` connections each.

    httpcore's pool walks every connection it holds for each request it assigns, so one pool with hundreds
    of streams in flight costs the client more CPU than reading them, and a busy client delays its own
    arrivals and first tokens. Small pools keep that cost flat; each request goes to the least busy one,
    so no pool ever queues a request while another has room.
    """

    def __init__(self, *, connections: int, timeout_s: float) -> None:
        count = max(1, math.ceil(connections / SHARD_CONNECTIONS))
        limits = httpx.Limits(
            max_connections=SHARD_CONNECTIONS,
            max_keepalive_connections=SHARD_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        tls = ssl.create_default_context()  # one for all: each costs milliseconds to build
        self._clients = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s), limits=limits, verify=tls, follow_redirects=False, trust_env=False
            )
            for _ in range(count)
        ]
        self._busy = [0] * count

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[httpx.AsyncClient]:
        index = min(range(len(self._busy)), key=self._busy.__getitem__)
        self._busy[index] += 1
        try:
            yield self._clients[index]
        finally:
            self._busy[index] -= 1

    async def __aenter__(self) -> ClientShards:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await asyncio.gather(*(client.aclose() for client in self._clients), return_exceptions=True)


class _Answered(Exception):  # noqa: N818 - not an error: ends the exchange with a failure it already knows
    def __init__(self, kind: FailureKind, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status_code = status_code


@dataclass(slots=True)
class _Exchange:
    """What is known so far about one request, kept when a deadline or a dropped connection ends it."""

    started: float
    status_code: int | None = None
    ttft_s: float | None = None
    ended_s: float | None = None  # the answer was complete at this many seconds after sending
    usage: Usage | None = None


async def send(
    client: httpx.AsyncClient,
    target: Target,
    planned: PlannedRequest,
    *,
    run_started: float,
    clock: Callable[[], float] = time.monotonic,
) -> RequestResult:
    """Send `planned` once and read the whole answer; the result says how it went."""
    exchange = _Exchange(started=clock())
    failure: _Answered | None = None
    try:
        async with asyncio.timeout(target.timeout_s) as deadline:
            await _exchange(client, target, planned, exchange=exchange, deadline=deadline, clock=clock)
    except _Answered as answered:
        failure = answered
    except (TimeoutError, httpx.TimeoutException):
        failure = _Answered(FailureKind.TIMEOUT, f"no complete answer within {target.timeout_s:g} s")
    except httpx.ConnectError as error:
        kind = _connect_kind(error)
        where = "the client cannot open a connection" if kind is FailureKind.DROPPED_BY_CLIENT else "cannot connect"
        failure = _Answered(kind, f"{where}: {_reason(error)}")
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError) as error:
        failure = _Answered(FailureKind.CONNECTION_RESET, f"connection dropped: {_reason(error)}")
    except StreamError as error:
        failure = _Answered(FailureKind.PROTOCOL, str(error))
    except httpx.HTTPError as error:
        failure = _Answered(FailureKind.PROTOCOL, f"{type(error).__name__}: {_reason(error)}")
    return _result(planned, exchange, failure, run_started=run_started, now=clock())


async def _exchange(
    client: httpx.AsyncClient,
    target: Target,
    planned: PlannedRequest,
    *,
    exchange: _Exchange,
    deadline: asyncio.Timeout,
    clock: Callable[[], float],
) -> None:
    async with client.stream("POST", target.endpoint, json=target.body(planned), headers=target.headers) as response:
        exchange.status_code = response.status_code
        if not response.is_success:
            raise _http_failure(response.status_code, await _read_capped(response, ERROR_BODY_BYTES))
        if "text/event-stream" not in response.headers.get("content-type", ""):
            exchange.usage = read_whole_answer(await _read_capped(response, WHOLE_ANSWER_BYTES))
            exchange.ended_s = clock() - exchange.started
            return
        reader = StreamReader()

        def take(line: str) -> None:
            if reader.done:
                return  # the end of the HTTP body, read so the connection can be reused
            if reader.feed(line) and exchange.ttft_s is None:
                exchange.ttft_s = clock() - exchange.started
            if reader.error is not None:
                raise _stream_failure(reader.error.message, reader.error.status_code)
            if reader.done:
                exchange.ended_s = clock() - exchange.started
                exchange.usage = reader.usage
                deadline.reschedule(min(_when(deadline), asyncio.get_running_loop().time() + DRAIN_S))

        lines = SseLines()  # not aiter_lines(): it also splits at characters a JSON string holds (SseLines says)
        async for text in response.aiter_text():
            for line in lines.feed(text):
                take(line)
        for line in lines.close():
            take(line)
        if not reader.complete:
            raise _Answered(FailureKind.CONNECTION_RESET, "the stream ended before the answer was complete")
        if exchange.ended_s is None:  # a server that sends a finish_reason but no data: [DONE]
            exchange.ended_s = clock() - exchange.started
            exchange.usage = reader.usage


def _result(
    planned: PlannedRequest, exchange: _Exchange, failure: _Answered | None, *, run_started: float, now: float
) -> RequestResult:
    if exchange.ended_s is not None:  # complete: what went wrong after [DONE] (a slow close) does not matter
        usage = exchange.usage
        return RequestResult(
            index=planned.index,
            started_s=exchange.started - run_started,
            duration_s=exchange.ended_s,
            requested_prompt_tokens=planned.prompt_words,
            requested_output_tokens=planned.max_tokens,
            status_code=exchange.status_code,
            ttft_s=exchange.ttft_s,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
        )
    if failure is None:  # cannot happen: an exchange without an end always raised
        failure = _Answered(FailureKind.PROTOCOL, "the answer ended without completing")
    return RequestResult(
        index=planned.index,
        started_s=exchange.started - run_started,
        duration_s=now - exchange.started,
        requested_prompt_tokens=planned.prompt_words,
        requested_output_tokens=planned.max_tokens,
        status_code=failure.status_code if failure.status_code is not None else exchange.status_code,
        failure=failure.kind,
        error=str(failure),
    )


def _http_failure(status: int, body: bytes) -> _Answered:
    message = f"HTTP {status}: {error_message(body)}"
    if 400 <= status <= 499:
        return _Answered(FailureKind.HTTP_4XX, message, status)
    if 500 <= status <= 599:
        return _Answered(FailureKind.HTTP_5XX, message, status)
    return _Answered(FailureKind.PROTOCOL, message, status)


def _stream_failure(message: str, status: int | None) -> _Answered:
    """An error object sent in place of a chunk: an HTTP failure when it carries a status, else protocol."""
    if status is not None and 400 <= status <= 599:
        return _http_failure(status, message.encode())
    return _Answered(FailureKind.PROTOCOL, f"error event mid-stream: {message}")


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk[: max_bytes - size])
        size += len(chunk)
        if size >= max_bytes:
            break
    return b"".join(chunks)


def _when(deadline: asyncio.Timeout) -> float:
    when = deadline.when()
    return when if when is not None else float("inf")


def _connect_kind(error: BaseException) -> FailureKind:
    """Refused (or no route), reset while connecting, or the client itself out of sockets or ports."""
    cause: BaseException | None = error
    for _ in range(8):  # exception chains are short; bounded all the same
        if cause is None:
            break
        if isinstance(cause, ConnectionResetError | BrokenPipeError):
            return FailureKind.CONNECTION_RESET
        if isinstance(cause, OSError) and cause.errno in _CLIENT_EXHAUSTED:
            return FailureKind.DROPPED_BY_CLIENT  # not the server's doing: never a sign that it died
        cause = cause.__cause__ or cause.__context__
    return FailureKind.CONNECTION_REFUSED


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__
