"""A loopback router in front of vLLM replicas that honours readiness, as a Kubernetes Service does. Does I/O.

Each replica is an endpoint while its readiness probes pass, with the periods and thresholds read from the
shipped manifests: vLLM's `/health` (deploy/kubernetes/base/vllm-deployment.yaml) and, when a sidecar runs
beside it, the sidecar's `/readyz` (deploy/kubernetes/add-sidecar/sidecar.yaml); back after one success (the
manifests' successThreshold). A request goes to the next ready replica
in turn; with none ready it gets 503 at once. Nothing is retried: a request sent to a replica that died
between two probes fails, as it would through kube-proxy.

Each request gets its own connection to the replica (`Connection: close`), and the replica's answer is
copied back byte for byte, streamed responses included. The router's own `/health` answers 200 while it
runs, so a load tester in front of it keeps sending whatever happens behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HEAD_LIMIT_BYTES = 64 * 1024
BODY_LIMIT_BYTES = 4 * 2**20
_COPY_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Probe:
    url: str
    period_s: float
    failure_threshold: int


KUBERNETES = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


@dataclass(frozen=True, slots=True)
class ProbeTiming:
    period_s: float
    failure_threshold: int


@functools.cache
def shipped_readiness(manifest: str, container: str) -> ProbeTiming:
    """The readinessProbe of `container` in a shipped manifest, with Kubernetes' defaults where it says nothing."""
    for document in yaml.safe_load_all((KUBERNETES / manifest).read_text()):
        if not isinstance(document, dict) or document.get("kind") != "Deployment":
            continue
        containers: list[dict[str, Any]] = document["spec"]["template"]["spec"]["containers"]
        for each in containers:
            if each["name"] == container:
                probe = each["readinessProbe"]
                return ProbeTiming(float(probe.get("periodSeconds", 10)), int(probe.get("failureThreshold", 3)))
    raise LookupError(f"no readinessProbe for container {container!r} in {manifest}")


def vllm_health_timing() -> ProbeTiming:
    return shipped_readiness("base/vllm-deployment.yaml", "vllm")


def sidecar_readyz_timing() -> ProbeTiming:
    return shipped_readiness("add-sidecar/sidecar.yaml", "vllm-sidecar")


@dataclass(frozen=True, slots=True)
class Routed:
    """One completion the router sent on: when, to which replica, and when its answer had come back whole."""

    sent_s: float  # time.monotonic()
    replica: int  # index in Router.replicas
    answered_s: float | None  # None: the replica never finished it (hung, died, or the router stopped first)


@dataclass(slots=True)
class Replica:
    host: str
    port: int
    probes: tuple[Probe, ...]
    ready: list[bool] = field(default_factory=list)  # one per probe
    sent: int = 0  # completions routed here

    @property
    def is_ready(self) -> bool:
        return bool(self.ready) and all(self.ready)


def replica(vllm_url: str, readyz_url: str | None) -> Replica:
    """A replica probed as the shipped manifests probe it: vLLM's /health, and the sidecar's /readyz if any."""
    parts = httpx.URL(vllm_url)
    health = vllm_health_timing()
    probes = [Probe(vllm_url + "/health", health.period_s, health.failure_threshold)]
    if readyz_url is not None:
        readyz = sidecar_readyz_timing()
        probes.append(Probe(readyz_url, readyz.period_s, readyz.failure_threshold))
    return Replica(host=parts.host, port=parts.port or 80, probes=tuple(probes))


class Router:
    """Runs on its own thread and event loop; `start` returns once it listens, `stop` ends it."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.unrouted = 0  # completions answered 503: no replica was ready
        self.routed: list[Routed] = []  # every completion sent on, appended when its answer ended or the router stops
        self.port = 0
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._serving: set[asyncio.Task[object]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Router:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:  # the first probes, before any request is routed
            for each in self.replicas:
                each.ready = [await _passes(client, probe.url) for probe in each.probes]
        for each in self.replicas:
            for index, probe in enumerate(each.probes):
                self._tasks.append(asyncio.create_task(self._probe(each, index, probe)))
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        pending = [*self._tasks, *self._serving]  # requests still waiting on a hung replica, too
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _probe(self, each: Replica, index: int, probe: Probe) -> None:
        failures = 0
        async with httpx.AsyncClient(timeout=min(probe.period_s, 2.0)) as client:
            while True:
                await asyncio.sleep(probe.period_s)
                if await _passes(client, probe.url):
                    failures = 0
                    each.ready[index] = True
                else:
                    failures += 1
                    if failures >= probe.failure_threshold:
                        each.ready[index] = False

    def _pick(self, *, counted: bool) -> Replica | None:
        for offset in range(len(self.replicas)):
            candidate = self.replicas[(self._next + offset) % len(self.replicas)]
            if candidate.is_ready:
                self._next = (self._next + offset + 1) % len(self.replicas)
                candidate.sent += counted
                return candidate
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, _, header_block = head.partition(b"\r\n")
            method, path = [*request_line.split(b" "), b"", b""][:2]
            headers = [line for line in header_block.split(b"\r\n") if line]
            length = 0
            for line in headers:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length > BODY_LIMIT_BYTES:
                await _answer(writer, 413, b"request body too large")
                return
            body = await reader.readexactly(length) if length else b""
            if path == b"/health" and method == b"GET":
                await _answer(writer, 200, b"router up")
                return
            completion = method == b"POST"  # the load tester's other requests look at the server
            target = self._pick(counted=completion)
            if target is None:
                self.unrouted += completion
                await _answer(writer, 503, b"no ready replica")
                return
            kept = [line for line in headers if line.partition(b":")[0].strip().lower() != b"connection"]
            forwarded = b"\r\n".join([request_line, *kept, b"Connection: close"]) + b"\r\n\r\n" + body
            sent_s = time.monotonic()
            answered = False
            try:
                answered = await _forward(target, forwarded, writer)
            finally:
                if completion:
                    answered_s = time.monotonic() if answered else None
                    self.routed.append(Routed(sent_s, self.replicas.index(target), answered_s))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass  # the client went away or sent something that is not HTTP: nothing to answer
        except asyncio.CancelledError:
            pass  # the router stops: asyncio's server callback would report a cancelled task as an error
        finally:
            writer.close()


async def _forward(target: Replica, request: bytes, client: asyncio.StreamWriter) -> bool:
    """Copy the replica's answer back; True when it came back whole (the replica closed after answering)."""
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(target.host, target.port)
    except OSError:
        await _answer(client, 502, b"replica refused the connection")
        return False
    try:
        upstream_writer.write(request)
        await upstream_writer.drain()
        answered = False
        while chunk := await upstream_reader.read(_COPY_CHUNK_BYTES):
            answered = True
            client.write(chunk)
            await client.drain()
    except ConnectionError:
        return False  # the replica died mid-answer: the client sees a cut-off response, as it would
    finally:
        upstream_writer.close()
    return answered


async def _answer(writer: asyncio.StreamWriter, status: int, text: bytes) -> None:
    reason = {200: "OK", 413: "Payload Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(text)}\r\n"
        "Connection: close\r\n\r\n".encode("ascii")
        + text
    )
    await writer.drain()


async def _passes(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url)).status_code == httpx.codes.OK
    except httpx.HTTPError:
        return False
