"""One poll of every source, and the sources it reads: what the daemon ticks and `once` runs a single time.

Reads vLLM, the GPUs and the allocator probe concurrently, asks the restart adapter who restarts a vLLM that is
gone, pushes the snapshot into the window, derives, and publishes the view. Does network I/O (through the
sources); owns no loop, scheduler or clock of its own (the caller's are injected).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx
import structlog
from structlog.typing import FilteringBoundLogger

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.health import HEALTH_STANDS
from sidecar.model.snapshot import Snapshot
from sidecar.model.supervision import Restarter, Supervision
from sidecar.model.view import View
from sidecar.shell.settings import ScrapeSettings, core_values
from sidecar.shell.transitions import TransitionLog
from sidecar.sources.allocator_probe import AllocatorProbeSource
from sidecar.sources.fetch import BodyFetcher, HttpxFetcher, PlainHttpFetcher
from sidecar.sources.gpu import GpuSource
from sidecar.sources.sim_gpu import SimGpuSource
from sidecar.sources.vllm_command import ServerCommandMemory
from sidecar.sources.vllm_http import VllmHttpSource
from sidecar.sources.vllm_start import VllmStartWatch, boot_clock_s

NO_NVML_HINT = "give --gpu-source none to run without GPU memory readings"  # `run` and `once`, no NVIDIA driver
# A poll's slack before the first one that found vLLM gone (see Poller._unless_started_elsewhere).
POLL_SLACK_S = 2.0


def derive_settings(settings: ScrapeSettings) -> DeriveSettings:
    return DeriveSettings(**core_values(settings, "derive"))


def build_gpu_source(settings: ScrapeSettings, fetcher: BodyFetcher) -> GpuSource | None:
    if settings.gpu_source == "none":
        return None
    if settings.gpu_source == "sim":
        return SimGpuSource(
            fetcher=fetcher,
            url=settings.vllm_url + "/sim/gpu",
            timeout_s=settings.poll_timeout_s,
            gpu_indices=settings.gpu_indices,
            vllm_process_pattern=settings.vllm_process_pattern,
        )
    from sidecar.sources.nvml import NvmlSource  # noqa: PLC0415 - pynvml is only imported when NVML is chosen

    return NvmlSource(
        gpu_indices=settings.gpu_indices,
        vllm_process_pattern=settings.vllm_process_pattern,
        timeout_s=settings.poll_timeout_s,  # a driver that stops answering must not stop the tick
        unavailable_hint=NO_NVML_HINT,
    )


def build_http_client(settings: ScrapeSettings) -> httpx.AsyncClient:
    # Pool timeouts etc. are a backstop; VllmHttpSource bounds each whole request with its own deadline.
    return httpx.AsyncClient(timeout=httpx.Timeout(settings.poll_timeout_s), follow_redirects=False, trust_env=False)


def build_vllm_fetcher(settings: ScrapeSettings, shared: httpx.AsyncClient) -> BodyFetcher:
    """What polls vLLM: the small keep-alive client for http:// (a fraction of httpx's CPU per poll, see
    sidecar.sources.fetch), the shared httpx client for https://. Closed with `aclose` (the shared client stays
    open: its owner closes it)."""
    return PlainHttpFetcher() if urlsplit(settings.vllm_url).scheme == "http" else HttpxFetcher(shared)


async def _nothing() -> None:
    return None


def build_vllm_source(settings: ScrapeSettings, fetcher: BodyFetcher) -> VllmHttpSource:
    """vLLM's /metrics, /health and /version as `run` and `once` both read them."""
    return VllmHttpSource(
        fetcher=fetcher,
        base_url=settings.vllm_url,
        timeout_s=settings.poll_timeout_s,
        max_body_bytes=settings.max_response_bytes,
    )


def build_allocator_source(settings: ScrapeSettings) -> AllocatorProbeSource | None:
    if settings.probe_dir is None:
        return None
    return AllocatorProbeSource(directory=settings.probe_dir, timeout_s=settings.poll_timeout_s)


class Poller:
    """One tick: read every source concurrently, push the snapshot, derive, publish the view."""

    def __init__(
        self,
        *,
        vllm: VllmHttpSource,
        gpu: GpuSource | None,
        derive: DeriveSettings,
        allocator: AllocatorProbeSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        logger: FilteringBoundLogger | None = None,
        on_view: Callable[[View], object] | None = None,
        supervision: Callable[[], Awaitable[Supervision]] | None = None,
        supervision_timeout_s: float = 2.0,
        start_watch: VllmStartWatch | None = None,
        command_memory: ServerCommandMemory | None = None,
        boot_clock: Callable[[], float] = boot_clock_s,
    ) -> None:
        self._on_view = on_view
        self._supervision = supervision
        self._supervision_timeout_s = supervision_timeout_s
        self._start_watch = start_watch
        self._command_memory = command_memory
        self._boot_clock = boot_clock
        self._gone_since_boot_s: float | None = None  # the first poll of this spell with nothing listening
        self._reached_boot_s: float | None = None  # when the last poll that reached vLLM began: it was up then
        self._vllm = vllm
        self._gpu = gpu
        self._allocator = allocator
        self._window = Window(span_s=derive.span_s)
        self._deriver = Deriver(derive)
        self._clock = clock
        self._wall_clock = wall_clock
        self._log = logger if logger is not None else structlog.get_logger()
        self._transitions = TransitionLog(self._log)
        self._view: View | None = None
        self.last_tick_completed_s: float | None = None

    @property
    def view(self) -> View | None:
        return self._view

    async def tick(self) -> View:
        began_boot_s = self._boot_clock()
        if self._gpu is None and self._allocator is None and self._vllm.health_stands():
            # Most ticks: /health is not due, so /metrics alone, without a task for each (see health()).
            reading, health, gpu, allocator = await self._vllm.read(), HEALTH_STANDS, None, None
        else:
            # Every source at once; each bounds its own time (the probe's directory read too).
            reading, health, gpu, allocator = await asyncio.gather(
                self._vllm.read(),
                self._vllm.health(),
                self._gpu.read() if self._gpu is not None else _nothing(),
                self._allocator.read() if self._allocator is not None else _nothing(),
            )
        newly_reached = self._gone_since_boot_s is not None or self._reached_boot_s is None
        if not reading.unreachable:
            self._gone_since_boot_s = None
            self._reached_boot_s = began_boot_s
        elif self._gone_since_boot_s is None:
            self._gone_since_boot_s = self._boot_clock()
        supervision = await self._who_restarts() if reading.unreachable else None
        if self._command_memory is not None:
            await self._command_memory.observe(reached=not reading.unreachable, newly_reached=newly_reached)
        snapshot = Snapshot(
            monotonic_s=self._clock(),
            wall_time_s=self._wall_clock(),
            vllm=reading,
            vllm_healthy=health.ok,
            vllm_health=health,
            gpu=gpu,
            allocator=allocator,
            vllm_supervision=supervision,
        )
        self._window.push(snapshot)
        derived = self._deriver.derive(self._window)
        view = View(snapshot=snapshot, derived=derived)
        self._view = view
        self.last_tick_completed_s = self._clock()
        self._transitions.observe(snapshot, derived)
        if self._on_view is not None:
            self._on_view(view)  # the policy decides on the view just published
        return view

    async def _who_restarts(self) -> Supervision | None:
        """Asked of the restart adapter while nothing listens at vLLM's address; bounded, never raises."""
        if self._supervision is None:
            return None
        try:
            async with asyncio.timeout(self._supervision_timeout_s):
                said = await self._supervision()
        except TimeoutError:
            detail = f"the restart adapter did not say within {self._supervision_timeout_s:g} s"
            return Supervision(restarter=Restarter.UNKNOWN, detail=detail)
        except Exception as error:  # noqa: BLE001 - a platform's answer must never end the tick
            detail = f"the restart adapter failed to say: {type(error).__name__}: {error}"
            return Supervision(restarter=Restarter.UNKNOWN, detail=detail)
        return self._unless_started_elsewhere(said)

    def _unless_started_elsewhere(self, said: Supervision) -> Supervision:
        """Nobody else will start vLLM, the adapter says; unless a vLLM server for its port started since it
        went (by hand, or a script of the operator's): that one is loading, and is left to load."""
        if said.restarter is not Restarter.SIDECAR or self._start_watch is None or self._gone_since_boot_s is None:
            return said
        # A server started after the last poll that reached vLLM began is not the one that answered it. Polls are
        # an interval apart (more on a busy box): a hand restart that killed the old vLLM and started the new one
        # between two polls started it before the first poll that found nothing (CI run 7 of 2026-11-30). Without
        # such a poll (vLLM never reached since the sidecar started), a poll's slack before that first one.
        since = self._reached_boot_s if self._reached_boot_s is not None else self._gone_since_boot_s - POLL_SLACK_S
        started = self._start_watch.started_since(since)
        if not started:
            return said
        newest = max(started, key=lambda server: server.started_boot_s)
        ago = self._boot_clock() - newest.started_boot_s
        detail = f"a vLLM server for its port started {ago:.0f} s ago, not by the sidecar (pid {newest.pid}: "
        detail += f"{newest.command})"
        return Supervision(restarter=Restarter.SUPERVISOR, detail=detail)
