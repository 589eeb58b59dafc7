"""Said once: every abnormal steady state the sidecar can be in, held for 60 polls, logs when it starts, when
it changes and when it clears, never per poll.

The whole tick runs (the vLLM source over HTTP through httpx's MockTransport, the GPU source, derive, the
policy, acting, the transition log) on a virtual clock, with structlog's log capture counting the lines.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from sidecar.actuators.none import NoActuator
from sidecar.derive.settings import DeriveSettings
from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading, ProcessOwner
from sidecar.model.source import SourceResult
from sidecar.notify.message import Notification
from sidecar.policy.machine import Policy
from sidecar.policy.probe import ProbeOutcome
from sidecar.policy.settings import PolicySettings
from sidecar.shell.acting import Acting
from sidecar.shell.poller import Poller
from sidecar.shell.state_file import StateFile
from sidecar.sources.fetch import HttpxFetcher
from sidecar.sources.probe import ProbeAnswer
from sidecar.sources.vllm_http import VllmHttpSource

URL = "http://vllm.test:8000"
INTERVAL_S = 2.0
POLLS = 60
GIB = 2**30


@dataclass
class FakeVllm:
    """What vLLM answers on each poll; `poll` counts them, so counters can advance like a working engine."""

    kv_usage: float = 0.3
    running: int = 2
    waiting: int = 0
    progressing: bool = True
    metrics: Callable[[FakeVllm], httpx.Response] | None = None
    health: int | None = 200  # None: nothing listens
    poll: int = 0

    def exposition(self) -> bytes:
        tokens = 10.0 * self.poll if self.progressing else 0.0
        return (
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {self.kv_usage}\n'
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.running}\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.waiting}\n'
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}\n'
            f'vllm:cache_config_info{{block_size="16",engine="0",gpu_memory_utilization="0.9",'
            f'num_gpu_blocks="1000"}} 1.0\n'
        ).encode()

    def answer(self, request: httpx.Request) -> httpx.Response:
        if self.health is None:
            error = httpx.ConnectError("[Errno 111] Connection refused", request=request)
            error.__cause__ = ConnectionRefusedError(111, "Connection refused")  # as httpcore raises it
            raise error
        if request.url.path == "/health":
            return httpx.Response(self.health)
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if request.url.path == "/metrics":
            self.poll += 1
            return self.metrics(self) if self.metrics is not None else httpx.Response(200, content=self.exposition())
        return httpx.Response(404)


@dataclass
class FakeGpu:
    """One 80 GiB GPU whose vLLM process grows by `growth_bytes` a poll (a leak), or an NVML that fails."""

    used_bytes: int = 60 * GIB
    growth_bytes: int = 0
    error: str | None = None
    reads: int = field(default=0)

    async def read(self) -> SourceResult[GpuReading]:
        if self.error is not None:
            return SourceResult(source="nvml", duration_s=0.001, error=self.error)
        self.reads += 1
        used = self.used_bytes + self.reads * self.growth_bytes
        device = GpuDevice(
            index=0,
            uuid="GPU-0",
            name="Test GPU",
            memory_total_bytes=80 * GIB,
            memory_used_bytes=used,
            memory_free_bytes=80 * GIB - used,
            utilization_ratio=0.5,
            temperature_celsius=50.0,
            processes=(GpuProcess(pid=10, used_memory_bytes=used, name="vllm", owner=ProcessOwner.VLLM),),
            xid_errors_total=0,
            last_xid=None,
        )
        return SourceResult(source="nvml", duration_s=0.001, value=GpuReading(devices=(device,), driver_version="1"))

    def close(self) -> None:
        return None


@dataclass
class Scene:
    """A steady state: what vLLM and the GPU do from the first poll (after `healthy_first` normal polls)."""

    vllm: FakeVllm
    gpu: FakeGpu | None = None
    settings: PolicySettings = field(default_factory=lambda: PolicySettings(stale_after_s=3 * INTERVAL_S))
    dry_run: bool = False
    healthy_first: int = 0
    probe: ProbeOutcome | None = None  # what the engine probe gets back; None: no probe sender
    read_only_state: bool = False  # --state-dir on a read-only file system (allowed with --actuator none)


@dataclass
class FakeProber:
    outcome: ProbeOutcome
    sent: int = 0

    async def probe(self, *, warm_up: bool = False) -> ProbeAnswer:
        self.sent += 1
        detail = "no answer within 60 s" if self.outcome is ProbeOutcome.NO_ANSWER else f"answer {self.sent}"
        return ProbeAnswer(outcome=self.outcome, detail=detail, duration_s=0.5)


def _malformed(_: FakeVllm) -> httpx.Response:
    return httpx.Response(200, content=b"<html>502 Bad Gateway</html>\n")


def _metrics_500(_: FakeVllm) -> httpx.Response:
    return httpx.Response(500, content=b"boom")


SCENES: dict[str, Callable[[], Scene]] = {
    "vllm down since the start": lambda: Scene(FakeVllm(health=None)),
    "vllm gone after it was healthy": lambda: Scene(FakeVllm(health=None), healthy_first=5),
    "engine dead, no restart adapter": lambda: Scene(FakeVllm(health=503), healthy_first=5),
    "engine dead, no restart adapter, read-only state": lambda: Scene(
        FakeVllm(health=503), healthy_first=5, read_only_state=True
    ),
    "metrics not an exposition": lambda: Scene(FakeVllm(metrics=_malformed)),
    "metrics failing, vllm healthy": lambda: Scene(FakeVllm(metrics=_metrics_500)),
    "kv cache full: paused": lambda: Scene(FakeVllm(kv_usage=0.95)),
    "kv cache in the band: pressure": lambda: Scene(FakeVllm(kv_usage=0.85)),
    "kv cache full, dry run": lambda: Scene(FakeVllm(kv_usage=0.95), dry_run=True),
    "waiting queue: paused": lambda: Scene(FakeVllm(running=2, waiting=9)),
    "hung engine, restarts disabled": lambda: Scene(
        FakeVllm(progressing=False),
        settings=PolicySettings(stale_after_s=3 * INTERVAL_S, max_restarts_per_hour=0, hung_after_s=20),
    ),
    "oom forecast, vllm too young to restart": lambda: Scene(FakeVllm(), gpu=FakeGpu(growth_bytes=GIB // 8)),
    "nvml missing": lambda: Scene(FakeVllm(), gpu=FakeGpu(error="NVML not available: libnvidia-ml.so.1 not found")),
    "idle engine answering the probe": lambda: Scene(
        FakeVllm(running=0, progressing=False),
        settings=PolicySettings(stale_after_s=3 * INTERVAL_S, probe_after_s=4),
        probe=ProbeOutcome.ANSWERED,
    ),
    "engine wedged while idle, restarts disabled": lambda: Scene(
        FakeVllm(running=0, progressing=False),
        settings=PolicySettings(stale_after_s=3 * INTERVAL_S, probe_after_s=4, max_restarts_per_hour=0),
        probe=ProbeOutcome.NO_ANSWER,
    ),
}


async def _run(scene: Scene) -> list[list[dict[str, object]]]:
    """The log lines of each of the POLLS polls of the steady state."""
    clock = [1000.0]
    notes: list[Notification] = []
    healthy_first, wanted = scene.healthy_first, scene.vllm.health
    if healthy_first:
        scene.vllm.health = 200
    per_poll: list[list[dict[str, object]]] = []
    with tempfile.TemporaryDirectory(prefix="said-once-") as folder:
        acting = Acting(
            policy=Policy(scene.settings),
            actuator=NoActuator(),
            # /proc takes no new files: a state directory nothing can be written to.
            ledger_file=StateFile(Path("/proc/vllm-sidecar-test" if scene.read_only_state else folder) / "ledger.json"),
            notify=notes.append,
            logger=structlog.get_logger(),
            dry_run=scene.dry_run,
            clock=lambda: clock[0],
            wall_clock=lambda: 1.7e9 + clock[0],
            prober=None if scene.probe is None else FakeProber(scene.probe),
        )
        async with httpx.AsyncClient(transport=httpx.MockTransport(scene.vllm.answer)) as client:
            poller = Poller(
                vllm=VllmHttpSource(
                    fetcher=HttpxFetcher(client),
                    base_url=URL,
                    timeout_s=1.0,
                    max_body_bytes=2**20,
                    clock=lambda: clock[0],
                ),
                gpu=scene.gpu,
                derive=DeriveSettings(),
                clock=lambda: clock[0],
                wall_clock=lambda: 1.7e9 + clock[0],
                logger=structlog.get_logger(),
                on_view=acting.observe,
            )
            for number in range(healthy_first + POLLS):
                if number == healthy_first:
                    scene.vllm.health = wanted
                with capture_logs() as lines:
                    await poller.tick()
                    await asyncio.sleep(0)  # a restart task's outcome is logged on the loop
                    await asyncio.sleep(0)
                if number >= healthy_first:  # what an operator sees: the default level, info, and above
                    per_poll.append([dict(line) for line in lines if line["log_level"] != "debug"])
                clock[0] += INTERVAL_S
        await acting.close()
    return per_poll


@pytest.mark.parametrize("name", sorted(SCENES))
async def test_an_abnormal_steady_state_is_logged_once_not_per_poll(name: str) -> None:
    per_poll = await _run(SCENES[name]())
    lines = [line for poll in per_poll for line in poll]
    shown = "\n".join(f"{line['event']}: {line}" for line in lines)
    late = [line for poll in per_poll[POLLS // 2 :] for line in poll]
    assert late == [], f"{name}: still logging after {POLLS // 2} polls in the same state:\n{shown}"
    # A restart that fails for want of an adapter is the longest story: pressure, the restart's steps, its
    # outcome, the failed state and the guard that now blocks restarts, one line each.
    assert len(lines) <= 12, f"{name}: {len(lines)} lines in {POLLS} polls:\n{shown}"


async def test_with_no_restart_adapter_nothing_is_noted_in_flight_so_a_read_only_state_dir_says_nothing() -> None:
    per_poll = await _run(SCENES["engine dead, no restart adapter, read-only state"]())
    events = [line["event"] for poll in per_poll for line in poll]
    assert "restart_outcome" in events  # the restart was attempted (and refused: no adapter)
    assert "restart_in_flight_not_saved" not in events
