"""GPU memory of one simulated GPU and the vLLM engine process on it, as NVML would report it. Pure, no I/O.

The engine process holds its CUDA context, the weights and the whole KV pool (vLLM allocates it at start), the
activation memory PyTorch's caching allocator has reserved (the high-water mark of every step so far: the
allocator keeps what it got from the driver) and leaked allocator growth. Other processes (tenants) take what
is free. An allocation the free memory cannot cover is a CUDA out-of-memory error.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sidecar.sim.config import SimConfig, VllmVersion
from sidecar.sim.records import GpuProcessState, GpuState

IDLE_TEMPERATURE_CELSIUS = 31.0
FULL_LOAD_TEMPERATURE_CELSIUS = 74.0
THERMAL_TIME_CONSTANT_S = 30.0
SATURATING_BATCH_TOKENS = 2048  # a batch this large keeps every SM busy


@dataclass(frozen=True, slots=True, kw_only=True)
class OutOfMemory:
    """The numbers of PyTorch's CUDA OOM message at the failed allocation."""

    gpu: int
    tried_bytes: int
    total_bytes: int
    free_bytes: int
    process_bytes: int  # the engine process, non-PyTorch memory included
    allocated_bytes: int  # by PyTorch
    reserved_unallocated_bytes: int
    other_processes: tuple[GpuProcessState, ...]


class GpuMemory:
    def __init__(self, *, config: SimConfig, index: int, kv_pool_bytes: int) -> None:
        self._config = config
        self.index = index
        self.kv_pool_bytes = kv_pool_bytes
        self.activation_reserved_bytes = 0  # freed by empty_cache() after profiling; grows back with load
        self.activation_live_bytes = 0
        self._leaked = 0.0
        self.tenant_bytes = 0
        self.utilization_ratio = 0.0
        self.temperature_celsius = IDLE_TEMPERATURE_CELSIUS
        self._last_s: float | None = None
        self._rng = random.Random(config.seed * 1_000 + index)  # noqa: S311 - reproducible jitter, not security

    @property
    def total_bytes(self) -> int:
        return self._config.gpu_total_bytes

    @property
    def leaked_bytes(self) -> int:
        return int(self._leaked)

    @property
    def torch_reserved_bytes(self) -> int:
        cfg = self._config
        return cfg.weights_bytes + self.kv_pool_bytes + self.activation_reserved_bytes + self.leaked_bytes

    @property
    def vllm_bytes(self) -> int:
        return self._config.cuda_context_bytes + self.torch_reserved_bytes

    @property
    def used_bytes(self) -> int:
        return self.vllm_bytes + self.tenant_bytes

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)

    def activation_bytes(self, *, scheduled_tokens: int, context_tokens: int) -> int:
        """Activation memory a step needs (nothing when nothing runs)."""
        if scheduled_tokens == 0:
            return 0
        cfg = self._config
        return (
            cfg.activation_base_bytes
            + cfg.activation_bytes_per_batched_token * scheduled_tokens
            + cfg.activation_bytes_per_context_token * context_tokens
        )

    def set_tenant(self, wanted_bytes: int) -> None:
        """The other process takes what it wants of the free memory: its own allocation fails first, not vLLM's."""
        self.tenant_bytes = max(0, min(wanted_bytes, self.total_bytes - self.vllm_bytes))

    def advance(
        self, now_s: float, *, activation_bytes: int, finished_requests: int, busy_tokens: int
    ) -> OutOfMemory | None:
        """Move to `now_s` and run one step's allocations; an OutOfMemory (nothing applied) when they do not fit."""
        cfg = self._config
        elapsed_s = self._elapse(now_s)
        leak = cfg.leak_bytes_per_s * elapsed_s + cfg.leak_bytes_per_request * finished_requests
        growth = (
            int(self._leaked + leak) - self.leaked_bytes + max(0, activation_bytes - self.activation_reserved_bytes)
        )
        free = self.total_bytes - self.used_bytes
        if growth > free:
            return self._out_of_memory(growth, free)
        self._leaked += leak
        self.activation_reserved_bytes = max(self.activation_reserved_bytes, activation_bytes)
        self.activation_live_bytes = activation_bytes
        if busy_tokens == 0:
            self.utilization_ratio = 0.0
        else:
            # NVML utilisation is the share of time a kernel ran: even one decode keeps the GPU fairly busy.
            load = min(1.0, busy_tokens / SATURATING_BATCH_TOKENS)
            jitter = self._rng.uniform(-0.02, 0.02)
            self.utilization_ratio = min(1.0, max(0.0, 0.35 + 0.65 * load + jitter))
        self._warm(elapsed_s)
        return None

    def idle(self, now_s: float, *, utilization_ratio: float) -> None:
        """Time passes without a step (a hung or dead engine): nothing is allocated, the temperature follows."""
        self.activation_live_bytes = 0
        self.utilization_ratio = utilization_ratio
        self._warm(self._elapse(now_s))

    def state(self) -> GpuState:
        processes = [GpuProcessState(pid=self.engine_pid, name=self.engine_process_name, used_bytes=self.vllm_bytes)]
        if self.tenant_bytes > 0:
            cfg = self._config
            processes.append(GpuProcessState(pid=cfg.tenant_pid, name=cfg.tenant_name, used_bytes=self.tenant_bytes))
        return GpuState(
            index=self.index,
            uuid=f"GPU-5e1a0000-0000-4000-8000-{self.index:012d}",
            name=self._config.gpu_name,
            total_bytes=self.total_bytes,
            used_bytes=self.used_bytes,
            utilization_ratio=round(self.utilization_ratio, 3),
            temperature_celsius=round(self.temperature_celsius, 1),
            processes=tuple(processes),
        )

    @property
    def engine_pid(self) -> int:
        return self._config.engine_pid + self.index

    @property
    def engine_process_name(self) -> str:
        if self._config.vllm_version == VllmVersion.V0_6:
            # V0 sets no process title: NVML shows the interpreter's command line.
            return "python3 -m vllm.entrypoints.openai.api_server"
        return "VLLM::EngineCore" if self._config.data_parallel == 1 else f"VLLM::EngineCore_DP{self.index}"

    def _elapse(self, now_s: float) -> float:
        elapsed_s = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self._last_s = now_s
        return elapsed_s

    def _warm(self, elapsed_s: float) -> None:
        span = FULL_LOAD_TEMPERATURE_CELSIUS - IDLE_TEMPERATURE_CELSIUS
        target = IDLE_TEMPERATURE_CELSIUS + span * self.utilization_ratio
        self.temperature_celsius += (target - self.temperature_celsius) * min(1.0, elapsed_s / THERMAL_TIME_CONSTANT_S)

    def _out_of_memory(self, tried: int, free: int) -> OutOfMemory:
        # Between steps part of the activation pool sits free in segments too small for the next tensor, and leaked
        # growth is exactly such memory: both show as "reserved by PyTorch but unallocated".
        unallocated = self.leaked_bytes + self.activation_reserved_bytes // 8
        others: tuple[GpuProcessState, ...] = ()
        if self.tenant_bytes > 0:
            others = (
                GpuProcessState(
                    pid=self._config.tenant_pid, name=self._config.tenant_name, used_bytes=self.tenant_bytes
                ),
            )
        return OutOfMemory(
            gpu=self.index,
            tried_bytes=tried,
            total_bytes=self.total_bytes,
            free_bytes=max(0, free),
            process_bytes=self.vllm_bytes,
            allocated_bytes=self.torch_reserved_bytes - unallocated,
            reserved_unallocated_bytes=unallocated,
            other_processes=others,
        )
