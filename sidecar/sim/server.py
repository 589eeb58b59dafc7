"""The simulator's HTTP face: vLLM's OpenAI endpoints, /metrics, /health, /version, and /sim/gpu.

Does I/O: serves HTTP and drives the pure simulation on the wall clock (one step, then sleep for the
step's simulated duration). A death is real: vLLM's log lines, in-flight requests answered 500, /health
failing, and the process exiting about two seconds later, as vLLM's API server does after EngineDeadError.
A wedge is real as well: /health stays 200 and requests are held open, never answered, while /metrics stay
live (hang-queue) or freeze at the step the engine stopped (hang, hang-idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TextIO

from sidecar.exporter.server import HttpServer, Request, Response
from sidecar.sim.config import SimConfig
from sidecar.sim.engine import RequestRejectedError
from sidecar.sim.exposition import MetricsWriter
from sidecar.sim.exposition_cache import CacheSettings
from sidecar.sim.logs import RELEASES, preamble_lines
from sidecar.sim.openai import (
    DONE,
    Api,
    BadRequestError,
    CompletionRequest,
    completion_document,
    error_document,
    models_document,
    output_text,
    parse_request,
    stream_error_event,
    stream_event,
    usage_event,
)
from sidecar.sim.records import TokenEvent
from sidecar.sim.simulation import QueueOverflowError, Simulation

VERSIONS = {str(version): release for version, release in RELEASES.items()}  # what /version answers per profile
EXIT_AFTER_DEATH_S = 2.0  # vLLM's watchdog notices a dead engine and stops the API server within seconds
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# The simulator's wording (vLLM answers 503 while fault tolerance holds an engine unhealthy; its text varies).
ENGINE_FAULTED_MESSAGE = "The engine is unhealthy and waiting for fault-tolerance recovery; retry on another instance."
SHUTDOWN_MESSAGE = "The server is shutting down: request aborted."


def metrics_writer(config: SimConfig) -> MetricsWriter:
    """The /metrics writer a simulator with `config` serves: its vLLM version, engines and cache."""
    return MetricsWriter(
        str(config.vllm_version),
        model_name=config.model_name,
        engines=config.data_parallel,
        fault_tolerance=config.enable_fault_tolerance,
        cache=CacheSettings(
            max_model_len=config.max_model_len,
            num_gpu_blocks_per_engine=max(1, config.derived_num_gpu_blocks),
            block_size=config.block_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enable_prefix_caching=config.enable_prefix_caching,
        ),
    )


class _Stream:
    """Token events of one request, handed from the engine loop to its HTTP response."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[TokenEvent | str] = asyncio.Queue()  # a str is an error that ends it


class SimServer:
    def __init__(
        self,
        config: SimConfig,
        *,
        host: str,
        port: int,
        log: TextIO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._host = host
        self._log = log
        self._clock = clock
        # Log lines are stamped with now_s + wall_offset_s: make that the real wall clock.
        # The API server's log lines carry this process's real PID, as a supervisor would see it.
        self.config = config = dataclasses.replace(
            config, wall_offset_s=time.time() - clock(), api_server_pid=os.getpid()
        )
        self._writer = metrics_writer(config)
        self._simulation = Simulation(config, self._writer)
        self._streams: dict[str, _Stream] = {}
        self._http = HttpServer(host=host, port=port, handler=self._handle, max_body_bytes=8 * 2**20)
        self._dead = False
        self._frozen_metrics: bytes | None = None
        self._stopped = asyncio.Event()
        self._exit_code = 0
        self._created = int(time.time())

    @property
    def port(self) -> int:
        return self._http.port

    def _say(self, line: str, *, where: str = "api_server.py:1") -> None:
        """A line of the simulated API server itself, in vLLM's log format."""
        stamp = datetime.now(UTC).strftime("%m-%d %H:%M:%S")
        self._raw((f"(APIServer pid={self.config.api_server_pid}) INFO {stamp} [{where}] {line}",))

    def _raw(self, lines: tuple[str, ...]) -> None:
        """Lines the simulation wrote in full, vLLM prefix and timestamp included."""
        for line in lines:
            self._log.write(line + "\n")
        self._log.flush()

    async def run(self) -> int:
        """Start, serve until stopped or dead; return the process exit code."""
        now_s = self._clock()
        self._raw(preamble_lines(self.config, now_s + self.config.wall_offset_s))
        self._raw(self._simulation.startup_log(now_s))
        if self._simulation.startup_check(now_s) is not None:
            return 1  # the refusal is in the startup log, as vLLM prints it; it never listens
        await self._http.start()
        self._say(f"Started server process [{os.getpid()}]", where="launcher.py:1")
        self._say(f"Uvicorn running on http://{self._host}:{self.port} (Press CTRL+C to quit)")
        engine = asyncio.create_task(self._engine_loop())
        await self._stopped.wait()
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine
        await self._answer_held_requests()
        await self._http.stop()
        return self._exit_code

    async def _answer_held_requests(self) -> None:
        """Abort what is still in flight (a wedged engine holds every request) with an error, as vLLM does on
        SIGTERM without --shutdown-timeout, and give the handlers a moment to send it: a handler still waiting
        when the event loop closes would be cancelled mid-request."""
        for stream in self._streams.values():
            stream.queue.put_nowait(SHUTDOWN_MESSAGE)
        for _ in range(100):
            if not self._streams:
                return
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        self._say("Shutting down", where="launcher.py:1")
        self._stopped.set()

    async def _engine_loop(self) -> None:
        while True:
            outcome = self._simulation.step(self._clock())
            for event in outcome.tokens:
                stream = self._streams.get(event.request_id)
                if stream is not None:
                    stream.queue.put_nowait(event)
            if outcome.hung and self._frozen_metrics is None:
                self._frozen_metrics = self._render_metrics()  # a hung engine's /metrics stop changing
            if outcome.death is not None:
                await self._die(outcome.death.log_lines, outcome.death.engine)
                return
            await asyncio.sleep(outcome.duration_s)

    async def _die(self, log_lines: tuple[str, ...], engine: int = 0) -> None:
        self._dead = True
        self._raw(log_lines)
        for stream in self._streams.values():
            stream.queue.put_nowait(ENGINE_DEAD_MESSAGE)
        if self.config.enable_fault_tolerance:
            # vLLM's fault tolerance holds the faulted engine UNHEALTHY, waiting for a recovery instruction, for
            # engine_recovery_timeout_sec before it raises; meanwhile /health stays 200 (liveness only), new
            # requests get 503, and vllm:engine_healthy reads 0. No recovery is simulated.
            self._writer.engine_health(engine, healthy=False)
            self._say(f"[FT] Engine {engine} status -> UNHEALTHY", where="engine_core_sentinel.py:1")
            await asyncio.sleep(self.config.engine_recovery_timeout_s)
            self._say(f"[FT] No recovery within {self.config.engine_recovery_timeout_s:.0f}s timeout.")
        await asyncio.sleep(EXIT_AFTER_DEATH_S)
        self._say("Shutting down FastAPI HTTP server.", where="launcher.py:1")
        self._exit_code = 1
        self._stopped.set()

    def _render_metrics(self) -> bytes:
        return self._writer.render(self._simulation.engine_gauges())

    async def _handle(self, request: Request) -> Response:
        routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/health"): self._health,
            ("GET", "/ping"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/models"): self._models,
            ("GET", "/sim/gpu"): self._gpu,
        }
        method = "GET" if request.method == "HEAD" else request.method
        if (method, request.path) in routes:
            return routes[(method, request.path)](request)
        if (method, request.path) == ("POST", "/v1/completions"):
            return await self._complete(request, Api.COMPLETIONS)
        if (method, request.path) == ("POST", "/v1/chat/completions"):
            return await self._complete(request, Api.CHAT)
        return _json(HTTPStatus.NOT_FOUND, error_document(f"Not Found: {request.path}", 404))

    def _health(self, _: Request) -> Response:
        if self._dead and not self.config.enable_fault_tolerance:
            # vLLM >= 0.11 answers 503 on EngineDeadError; older versions let the error surface as 500.
            status = (
                HTTPStatus.SERVICE_UNAVAILABLE
                if self.config.vllm_version == "0.32"
                else HTTPStatus.INTERNAL_SERVER_ERROR
            )
            return Response(status=status)
        return Response(status=HTTPStatus.OK)

    def _version(self, _: Request) -> Response:
        return _json(HTTPStatus.OK, json.dumps({"version": VERSIONS[str(self.config.vllm_version)]}).encode())

    def _metrics(self, _: Request) -> Response:
        body = self._frozen_metrics if self._frozen_metrics is not None else self._render_metrics()
        return Response(status=HTTPStatus.OK, body=body, content_type=self._writer.content_type)

    def _models(self, _: Request) -> Response:
        return _json(HTTPStatus.OK, models_document(self.config.model_name, self.config.max_model_len, self._created))

    def _gpu(self, _: Request) -> Response:
        gpus = [asdict(state) for state in self._simulation.gpu_states(self._clock())]
        return _json(HTTPStatus.OK, json.dumps({"gpus": gpus}).encode())

    async def _complete(self, request: Request, api: Api) -> Response:
        if self._dead:
            if self.config.enable_fault_tolerance:
                return _json(HTTPStatus.SERVICE_UNAVAILABLE, error_document(ENGINE_FAULTED_MESSAGE, 503))
            return _json(HTTPStatus.INTERNAL_SERVER_ERROR, error_document(ENGINE_DEAD_MESSAGE, 500))
        try:
            parsed = parse_request(request.body, api, served_model=self.config.model_name, default_max_tokens=16)
            request_id = f"{'chatcmpl' if api is Api.CHAT else 'cmpl'}-{uuid.uuid4().hex}"
            self._simulation.add_request(request_id, parsed.prompt_token_ids, parsed.max_tokens, self._clock())
        except (BadRequestError, RequestRejectedError) as error:
            message = error.message if isinstance(error, RequestRejectedError) else str(error)
            return _json(HTTPStatus.BAD_REQUEST, error_document(message, 400))
        except QueueOverflowError as error:
            self._writer.admission_rejected(error.reason)
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, error_document(str(error), 503))
        stream = _Stream()
        self._streams[request_id] = stream
        if parsed.stream:
            return Response(
                status=HTTPStatus.OK,
                content_type="text/event-stream; charset=utf-8",
                stream=self._sse(parsed, request_id, stream),
            )
        try:
            return await self._whole(parsed, request_id, stream)
        finally:
            self._forget(request_id)

    async def _whole(self, parsed: CompletionRequest, request_id: str, stream: _Stream) -> Response:
        produced = 0
        while True:
            event = await stream.queue.get()
            if isinstance(event, str):
                return _json(HTTPStatus.INTERNAL_SERVER_ERROR, error_document(event, 500))
            produced += event.new_tokens
            if event.finished is not None:
                text = output_text(0, produced)
                body = completion_document(
                    parsed,
                    request_id=request_id,
                    created=int(time.time()),
                    text=text,
                    finish_reason=str(event.finished),
                    completion_tokens=produced,
                )
                return _json(HTTPStatus.OK, body)

    async def _sse(self, parsed: CompletionRequest, request_id: str, stream: _Stream) -> AsyncIterator[bytes]:
        produced = 0
        created = int(time.time())
        finished = False
        try:
            for _ in itertools.count():
                event = await stream.queue.get()
                if isinstance(event, str):
                    yield stream_error_event(event)
                    break
                text = output_text(produced, event.new_tokens)
                produced += event.new_tokens
                reason = str(event.finished) if event.finished is not None else None
                yield stream_event(parsed, request_id, created, text, reason)
                if event.finished is not None:
                    finished = True
                    if parsed.include_usage:
                        yield usage_event(parsed, request_id, created, produced)
                    break
            yield DONE
        finally:
            if not finished and not self._dead:
                self._simulation.abort(request_id, self._clock())  # the client went away: free its blocks
            self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)


def _json(status: int, body: bytes) -> Response:
    return Response(status=status, body=body, content_type="application/json")
