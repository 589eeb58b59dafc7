"""Reads one vLLM server over HTTP: /metrics (parsed), /version and /health. Does network I/O.

Every read is bounded in time (one deadline for the whole request, since httpx's timeouts apply per
phase and a server trickling bytes would never trip them) and in size (the body is counted as it
streams, so a 50 MB answer costs at most the cap). Failures come back as a one-line error, never raise.
The body comes from a `BodyFetcher` (sidecar.sources.fetch): httpx's, or for plain http:// the sidecar's own
small client, which costs a fraction of httpx's CPU per request; the daemon picks one by the URL's scheme, and
both give the same readings and the same error lines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace

import httpx

from sidecar.model.health import HEALTH_STANDS, HealthAnswer, HealthCheck
from sidecar.model.source import SourceResult
from sidecar.model.vllm import VllmReading
from sidecar.parse.exposition import ExpositionError
from sidecar.parse.vllm import read_vllm, vllm_sample_picker
from sidecar.sources.fetch import BodyFetcher, Failure, FetchFailedError

SOURCE = "vllm"
# vLLM's version changes only with a restart, which shows as a failed poll; asking every minute covers the rest.
VERSION_MAX_AGE_S = 60.0
# vLLM's /health turns 503 only on EngineDeadError, and its API server exits within seconds of that (both
# endpoints then refuse connections); a hung engine keeps it 200. So while /health answers 200 and /metrics
# reads, asking it every tick tells nothing new: a 200 stands for this long. After any other answer, or a
# /metrics read that failed, it is asked every tick again, so a dead engine is followed at full resolution.
# Under the 5 s vLLM keeps an idle connection (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so /health's connection is reused
# rather than opened anew each time.
HEALTH_MAX_AGE_S = 3.5
_SMALL_BODY_BYTES = 64 * 1024  # /version and /health answers are tiny; anything bigger is not them


class FetchError(Exception):
    """A request to vLLM failed; the message is one line naming the endpoint and the reason."""

    def __init__(self, message: str, *, refused: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.refused = refused
        self.status = status  # the HTTP status of an answer that was not 200; None when nothing answered


class VllmHttpSource:
    def __init__(
        self,
        *,
        fetcher: BodyFetcher,
        base_url: str,
        timeout_s: float,
        max_body_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetcher = fetcher
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._clock = clock
        self._version: str | None = None
        self._version_asked_at: float | None = None  # None: ask on the next read
        self._healthy_at: float | None = None  # when /health last answered 200; None: ask on the next tick
        self._last_read_ok = False
        self._load_offered: bool | None = None  # /load answered (True) or 404 (False); None: not known yet
        self._picker = vllm_sample_picker()
        # The last /metrics body read, and when (this source's clock): an incident keeps it (sidecar.shell.incident).
        # A reference to the text already decoded, so it costs no copy, and at most one body of memory.
        self.last_metrics: tuple[str, float] | None = None

    async def read(self) -> SourceResult[VllmReading]:
        """Fetch /metrics and /version concurrently and interpret them."""
        started = self._clock()
        # /version rides along (concurrently) once a minute; every other tick awaits /metrics alone, no task.
        version_task = asyncio.create_task(self._version_now()) if self._version_due(started) else None
        try:
            body = await self._fetch("/metrics", self._max_body_bytes)
            text = _decode(body)
            exposition = self._picker.pick(text)
        except (FetchError, ExpositionError) as error:
            if version_task is not None:
                version_task.cancel()
            self._version_asked_at = None  # a failed poll may be a restart, perhaps into another version
            self._load_offered = None  # ... with other flags
            message = str(error)
            # vLLM always serves its /metrics, as an exposition: whatever answers otherwise is something else
            wrong = isinstance(error, ExpositionError) or error.status == httpx.codes.NOT_FOUND
            if isinstance(error, ExpositionError):
                message = (
                    f"{self.base_url} answers, but is not vLLM: /metrics is not a Prometheus text exposition: {error}"
                )
            elif wrong:
                message = f"{self.base_url} answers, but is not vLLM: /metrics answered HTTP {error.status}"
            refused = isinstance(error, FetchError) and error.refused
            self._last_read_ok = False
            return SourceResult(
                source=SOURCE,
                duration_s=self._clock() - started,
                error=message,
                unreachable=refused,
                wrong_server=wrong,
            )
        if version_task is not None:
            version, answered = await version_task
            if answered:  # else the version known so far stays, and /version is asked again on the next poll
                self._version, self._version_asked_at = version, started
        self.last_metrics = (text, started)
        reading = read_vllm(exposition, url=self.base_url, version=self._version)
        if self._load_offered is not False and _reads_idle(reading):
            load = await self._server_load()
            if load is not None:
                reading = replace(reading, server_load=load)
        self._last_read_ok = True
        return SourceResult(source=SOURCE, duration_s=self._clock() - started, value=reading)

    async def _server_load(self) -> int | None:
        """vLLM's in-flight request count from /load; None when not offered or not understood (never an error).

        Asked only while every engine reads idle: that is where a wedged engine hides (its metrics frozen at 0
        running and 0 waiting while requests hang); under load the engines' own gauges show the work. vLLM
        counts only with --enable-server-load-tracking and answers 0 otherwise, which is then no evidence.
        """
        try:
            body = await self._fetch("/load", _SMALL_BODY_BYTES)
            document = json.loads(body)
        except FetchError as error:
            if error.status == httpx.codes.NOT_FOUND:
                self._load_offered = False  # older vLLM, or not vLLM: not asked again until a failed poll
            return None
        except (ValueError, RecursionError):
            return None
        self._load_offered = True
        load = document.get("server_load") if isinstance(document, dict) else None
        return load if isinstance(load, int) and not isinstance(load, bool) and load >= 0 else None

    def health_stands(self) -> bool:
        """Whether a 200 from /health is recent enough to stand without asking (see HEALTH_MAX_AGE_S)."""
        return (
            self._last_read_ok and self._healthy_at is not None and self._clock() - self._healthy_at < HEALTH_MAX_AGE_S
        )

    async def health(self) -> HealthCheck:
        """What /health answers within the timeout; a 200 less than HEALTH_MAX_AGE_S old stands while /metrics
        keeps reading (see HEALTH_MAX_AGE_S)."""
        if self.health_stands():
            return HEALTH_STANDS
        now = self._clock()
        try:
            await self._fetch("/health", _SMALL_BODY_BYTES)
        except FetchError as error:
            self._healthy_at = None
            return HealthCheck(answer=_answer(error), detail=str(error))
        self._healthy_at = now
        return HealthCheck(answer=HealthAnswer.OK, detail=f"vLLM {self.base_url}/health answered HTTP 200")

    def _version_due(self, now_s: float) -> bool:
        return self._version_asked_at is None or now_s - self._version_asked_at >= VERSION_MAX_AGE_S

    async def _version_now(self) -> tuple[str | None, bool]:
        """vLLM's version from /version, and whether /version answered: (None, True) when it is not offered or
        not understood (never an error); (None, False) when no answer came in time (a busy server at start):
        then the version is not wiped for a minute, as a passing timeout would have done (CI run 22)."""
        try:
            body = await self._fetch("/version", _SMALL_BODY_BYTES)
        except FetchError as error:
            return None, error.status is not None  # an HTTP status (404: not offered) is an answer
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: a deeply nested answer such as "[[[["
            return None, True
        version = document.get("version") if isinstance(document, dict) else None
        return (version if isinstance(version, str) and version else None), True

    async def _fetch(self, path: str, max_bytes: int) -> bytes:
        url = self.base_url + path
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._fetcher.get(url, max_bytes=max_bytes)
        except TimeoutError:
            raise FetchError(f"vLLM {url} did not answer within {self._timeout_s:g} s") from None
        except FetchFailedError as error:
            raise FetchError(_line(url, error), refused=error.refused, status=error.status) from None


def _line(url: str, error: FetchFailedError) -> str:
    match error.failure:
        case Failure.CONNECT:
            return f"vLLM unreachable at {url}: {error}"
        case Failure.DROPPED:
            return f"vLLM {url} dropped the connection mid-answer: {error}"
        case Failure.FAILED:
            return f"vLLM {url} failed: {error}"
        case Failure.BAD_URL:
            return f"vLLM {url} cannot be asked: {error}"
        case Failure.STATUS | Failure.TOO_LARGE:  # "answered HTTP 503", "answer of N bytes exceeds the ..."
            return f"vLLM {url} {error}"


def _reads_idle(reading: VllmReading) -> bool:
    return bool(reading.engines) and all(
        engine.requests_running == 0 and engine.requests_waiting == 0 for engine in reading.engines
    )


def _answer(error: FetchError) -> HealthAnswer:
    if error.refused:
        return HealthAnswer.REFUSED
    if error.status is None:
        return HealthAnswer.NO_ANSWER
    return HealthAnswer.NO_ENDPOINT if error.status == httpx.codes.NOT_FOUND else HealthAnswer.FAILING


def _decode(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FetchError(f"vLLM /metrics is not UTF-8 text (byte {error.start})") from None
