"""Looks at the server before, during and after a load test. Does network I/O.

Before: `GET /v1/models` (the model, its max_model_len; unreachable here means the run does not start),
`/health` and `/metrics` (which of them exist). During: `/metrics` and `/health` once a second, each read
bounded in time and size; a refused or reset connection, or a /health that stops answering 200, is a
sign the server is down (a slow answer under load is not). After: `/health` (or a TCP connect when the
server has no /health) tells whether the server survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from sidecar.loadtest.metrics import ServerWatch
from sidecar.loadtest.spec import MAX_DURATION_S, MAX_TIMEOUT_S, LoadSpec, SpecError
from sidecar.model.text import one_line
from sidecar.model.vllm import EngineMetrics
from sidecar.parse.exposition import ExpositionError
from sidecar.parse.vllm import read_vllm, vllm_sample_picker

PROBE_TIMEOUT_S = 10.0
POLL_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 1.0
MAX_METRICS_BYTES = 16 * 2**20
MAX_SMALL_BYTES = 4 * 2**20  # /v1/models, /health
_MAX_POLLS = math.ceil((MAX_DURATION_S + MAX_TIMEOUT_S) / POLL_INTERVAL_S) + 10


class UnreachableError(Exception):
    """The server cannot be used at the start; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """What the server said before the run."""

    model: str
    max_model_len: int | None  # from /v1/models, when the server reports it
    health_ok: bool  # /health answered 200
    metrics_ok: bool  # /metrics answered a vLLM exposition


async def probe(client: httpx.AsyncClient, spec: LoadSpec, watch: ServerWatch) -> ServerInfo:
    """Find the model and what the server offers; the first /metrics reading is the watch's baseline."""
    base = spec.url.rstrip("/")
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    try:
        status, body = await _get(client, base + "/v1/models", timeout_s=PROBE_TIMEOUT_S, headers=headers)
    except (TimeoutError, httpx.HTTPError) as error:
        raise UnreachableError(f"cannot reach {base}/v1/models: {_reason(error)}") from None
    served = _served_models(body) if status == httpx.codes.OK else {}
    if spec.model is None:
        if not served:
            raise UnreachableError(_no_model(base, status, body))
        model = next(iter(served))
    else:
        model = spec.model
        if served and model not in served:
            raise SpecError(f"--model {model!r} is not served by {base} (it serves: {', '.join(served)})")
    health_ok = await _status(client, base + "/health") == httpx.codes.OK
    engines = await _read_metrics(client, base + "/metrics")
    metrics_ok = engines is not None and any(engine.kv_cache_usage_ratio is not None for engine in engines)
    if engines is not None and metrics_ok:
        watch.observe_metrics(engines)
    return ServerInfo(model=model, max_model_len=served.get(model), health_ok=health_ok, metrics_ok=metrics_ok)


class Monitor:
    """Polls the server once a second during the run, feeding a ServerWatch."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        base_url: str,
        info: ServerInfo,
        watch: ServerWatch,
        run_started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._info = info
        self._watch = watch
        self._run_started = run_started
        self._clock = clock

    async def poll_until(self, stop: asyncio.Event) -> None:
        for _ in range(_MAX_POLLS):
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_INTERVAL_S):
                    await stop.wait()
            if stop.is_set():
                return

    async def poll_once(self) -> None:
        reads = []
        if self._info.metrics_ok:
            reads.append(self._poll_metrics())
        if self._info.health_ok:
            reads.append(self._poll_health())
        await asyncio.gather(*reads)

    async def final_check(self) -> None:
        """After the run: is the server still there?"""
        if self._info.health_ok:
            await self._poll_health(count_timeout=True)
            if self._info.metrics_ok and not self._watch.died:
                await self._poll_metrics()  # the last preemptions, after every request ended
            return
        url = httpx.URL(self._base)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                _, writer = await asyncio.open_connection(url.host, port)
        except TimeoutError:
            self._down(f"no TCP connection within {POLL_TIMEOUT_S:g} s at the end")
            return
        except OSError as error:
            self._down(f"{_reason(error)} at the end")
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if self._info.metrics_ok:
            await self._poll_metrics()

    async def _poll_metrics(self) -> None:
        try:
            engines = await _read_metrics(self._client, self._base + "/metrics", raise_down=True)
        except _DownError as down:
            self._down(str(down))
            return
        if engines is not None:
            self._watch.observe_metrics(engines)

    async def _poll_health(self, *, count_timeout: bool = False) -> None:
        try:
            status, _ = await _get(self._client, self._base + "/health", timeout_s=POLL_TIMEOUT_S)
        except (TimeoutError, httpx.TimeoutException):
            if count_timeout:  # the load is over: a server that cannot answer /health now is not serving
                self._down(f"/health did not answer within {POLL_TIMEOUT_S:g} s")
            return
        except httpx.HTTPError as error:
            if _is_down(error):
                self._down(_down_reason(error))
            return
        if status != httpx.codes.OK:
            self._down(f"/health answered HTTP {status}")

    def _down(self, reason: str) -> None:
        self._watch.observe_down(self._clock() - self._run_started, reason)


class _DownError(Exception):
    pass


# What the daemon's tick reads /metrics with, at its cost (a few ms for 1 MB): the samples the daemon reads,
# parsed strictly. Kept for the process: what it remembers (label sets) is a bounded cache, never an answer.
_PICKER = vllm_sample_picker()


async def _read_metrics(
    client: httpx.AsyncClient, url: str, *, raise_down: bool = False
) -> tuple[EngineMetrics, ...] | None:
    """The engines of a vLLM /metrics, or None when it cannot be read (absent, slow, not vLLM)."""
    try:
        status, body = await _get(client, url, timeout_s=POLL_TIMEOUT_S, max_bytes=MAX_METRICS_BYTES)
    except TimeoutError:
        return None
    except httpx.HTTPError as error:
        if raise_down and _is_down(error):
            raise _DownError(_down_reason(error)) from None
        return None
    if status != httpx.codes.OK:
        return None
    try:
        exposition = _PICKER.pick(body.decode("utf-8"))
    except (UnicodeDecodeError, ExpositionError):
        return None
    return read_vllm(exposition, url=url, version=None).engines


async def _status(client: httpx.AsyncClient, url: str) -> int | None:
    try:
        status, _ = await _get(client, url, timeout_s=PROBE_TIMEOUT_S)
    except (TimeoutError, httpx.HTTPError):
        return None
    return status


async def _get(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout_s: float,
    max_bytes: int = MAX_SMALL_BYTES,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """Status and body (cut at max_bytes) within one deadline; raises TimeoutError or httpx.HTTPError."""
    async with asyncio.timeout(timeout_s), client.stream("GET", url, headers=headers) as response:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return response.status_code, b""  # too big to be what it should be: read as nothing
        return response.status_code, b"".join(chunks)


def _no_model(base: str, status: int, body: bytes) -> str:
    """Why /v1/models gave no model to load: a server that answers but is no OpenAI API (a web server, the
    wrong port) is said to be that, not told to give --model."""
    if status == httpx.codes.NOT_FOUND:
        return f"{base} answers, but is not vLLM: /v1/models answered HTTP 404 (no OpenAI-compatible API there)"
    if status == httpx.codes.OK and _model_list(body) is None:
        return f"{base} answers, but is not vLLM: /v1/models is not an OpenAI model list ({_opening(body)})"
    return f"{base}/v1/models named no model (HTTP {status}): give --model"


def _model_list(body: bytes) -> list[object] | None:
    """The `data` list of an OpenAI model list, or None when the body is not one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    data = document.get("data") if isinstance(document, dict) else None
    return data if isinstance(data, list) else None


def _opening(body: bytes) -> str:
    """The answer's first characters, for a line that says what came instead."""
    text = one_line(body[:200].decode(errors="replace"), 60)
    return repr(text) if text else "an empty body"


def _served_models(body: bytes) -> dict[str, int | None]:
    """Model ids of a /v1/models answer, in order, with each one's max_model_len where reported."""
    served: dict[str, int | None] = {}
    for entry in _model_list(body) or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            length = entry.get("max_model_len")
            served[entry["id"]] = length if isinstance(length, int) and not isinstance(length, bool) else None
    return served


def _is_down(error: httpx.HTTPError) -> bool:
    return isinstance(error, httpx.ConnectError | httpx.ReadError | httpx.RemoteProtocolError | httpx.WriteError)


def _down_reason(error: httpx.HTTPError) -> str:
    return "connection refused" if isinstance(error, httpx.ConnectError) else "connection reset"


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError | httpx.TimeoutException):
        return f"no answer within {PROBE_TIMEOUT_S:g} s"
    cause: BaseException | None = error
    for _ in range(8):  # httpx says "All connection attempts failed"; the OS error under it says why
        if cause is None:
            break
        if isinstance(cause, OSError) and isinstance(cause.errno, int) and cause.errno > 0:
            return os.strerror(cause.errno).lower()  # asyncio's own strerror is "Connect call failed (...)"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror.lower()  # a resolver error: negative codes os.strerror does not know
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(error).split())
    return text or type(error).__name__
