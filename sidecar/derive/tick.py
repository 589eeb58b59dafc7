"""One tick of derivation: the window (with the new snapshot already in it) to `Derived`. Pure."""

from __future__ import annotations

from sidecar.derive.allocator import derive_allocators
from sidecar.derive.engine import EngineHistory, derive_engine
from sidecar.derive.gpu import MemoryHistory, derive_gpu
from sidecar.derive.kv import null_block_of
from sidecar.derive.progress import ProgressTracker
from sidecar.derive.rejections import RejectionHistory
from sidecar.derive.restart import RestartTracker
from sidecar.derive.settings import DeriveSettings
from sidecar.derive.window import Follower, Window
from sidecar.model.derived import Derived, EngineDerived, GpuDerived, ModelDerived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import VllmReading

HEALTH_FAILING = "vLLM /health is not answering 200 while /metrics answers"


class Deriver:
    """Holds what derivation carries between ticks (engine progress) and, so a tick does not rescan the whole
    window, the histories taken from it (engine readings, GPU memory, restart signs), each kept up to date a
    snapshot at a time and equal to what the functions in engine, gpu and restart compute from the window."""

    def __init__(self, settings: DeriveSettings) -> None:
        self.settings = settings
        self._progress = ProgressTracker()
        self._follower = Follower()
        self._engines = EngineHistory()
        self._memory = MemoryHistory()
        self._restarts = RestartTracker()
        self._rejections = RejectionHistory()

    def _follow(self, window: Window) -> None:
        newer, start_over = self._follower.advance(window)
        if start_over:
            self._engines.reset()
            self._memory.reset()
            self._restarts.reset()
            self._rejections.reset()
        first = self._follower.count - len(newer)
        for number, snapshot in enumerate(newer, start=first):
            self._engines.add(snapshot, number)
            self._memory.add(snapshot, number)
            self._restarts.add(snapshot, number)
            self._rejections.add(snapshot, number)

    def derive(self, window: Window) -> Derived:
        latest = window.latest()
        if latest is None:
            return Derived(engines=(), gpus=(), problems=())
        self._follow(window)
        oldest = self._follower.oldest
        now_s = latest.monotonic_s
        problems = list(_source_problems(latest))
        engines: tuple[EngineDerived, ...] = ()
        models: tuple[ModelDerived, ...] = ()
        reading = latest.vllm.value if latest.vllm.error is None else None
        if reading is not None:
            progress = self._progress.observe(reading.engines, now_s, reading.server_load)
            window_start_s = now_s - self.settings.window_s
            recent = self._follower.count - 1 - self.settings.short_horizon_polls  # first poll of the short horizon
            history = self._engines.windowed(window_start_s, oldest, recent)
            null_block = null_block_of(reading.schema, reading.version)
            engines = tuple(
                derive_engine(
                    engine,
                    history[(engine.model_name, engine.engine)],
                    progress[(engine.model_name, engine.engine)],
                    null_block=null_block,
                )
                for engine in reading.engines
            )
            models = self._rejections.derive(reading.models, window_start_s, oldest, recent)
        gpus: tuple[GpuDerived, ...] = ()
        if latest.gpu is not None and latest.gpu.value is not None and latest.gpu.error is None:
            utilization = self._gpu_memory_utilization(window, problems)
            trend_start_s = now_s - self.settings.memory_trend_window_s
            restarted_s = self._restarts.last_restart_s(trend_start_s, oldest)
            memory = self._memory.since(max(trend_start_s, restarted_s or trend_start_s), oldest)
            gpus = tuple(
                derive_gpu(device, memory.get(device.index, []), utilization, self.settings)
                for device in latest.gpu.value.devices
            )
        allocators = derive_allocators(window.newest_first(), horizon_polls=self.settings.short_horizon_polls)
        return Derived(engines=engines, gpus=gpus, problems=tuple(problems), models=models, allocators=allocators)

    def _gpu_memory_utilization(self, window: Window, problems: list[str]) -> float | None:
        if self.settings.gpu_memory_utilization is not None:
            return self.settings.gpu_memory_utilization
        reading = _latest_vllm_reading(window)
        if reading is None:
            return None
        values = {
            engine.cache_config.gpu_memory_utilization
            for engine in reading.engines
            if engine.cache_config is not None and engine.cache_config.gpu_memory_utilization is not None
        }
        if len(values) > 1:
            problems.append(
                f"vLLM engines report different gpu_memory_utilization values {sorted(values)}: GPU memory "
                "budget unknown (set --gpu-memory-utilization)"
            )
            return None
        return values.pop() if values else None


def _latest_vllm_reading(window: Window) -> VllmReading | None:
    """The newest successful reading: vLLM's budget does not change while it is briefly unreachable."""
    for snapshot in window.newest_first():
        if snapshot.vllm.error is None and snapshot.vllm.value is not None:
            return snapshot.vllm.value
    return None


def _source_problems(snapshot: Snapshot) -> list[str]:
    problems: list[str] = []
    if snapshot.vllm.error is not None:
        problems.append(snapshot.vllm.error)
    elif snapshot.vllm.value is not None:
        problems.extend(snapshot.vllm.value.problems)
    if snapshot.vllm_healthy is False and snapshot.vllm.error is None:
        problems.append(HEALTH_FAILING)
    if snapshot.gpu is not None:
        if snapshot.gpu.error is not None:
            problems.append(snapshot.gpu.error)
        elif snapshot.gpu.value is not None:
            problems.extend(snapshot.gpu.value.problems)
    if snapshot.allocator is not None:
        if snapshot.allocator.error is not None:
            problems.append(snapshot.allocator.error)
        elif snapshot.allocator.value is not None:
            problems.extend(f"probe: {problem}" for problem in snapshot.allocator.value.problems)
    return problems
