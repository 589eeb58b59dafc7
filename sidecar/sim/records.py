"""The values that pass between the simulation core, the /metrics writer and the HTTP server. Pure data.

The core (engine, KV cache, GPU memory, scenarios) is synchronous and takes `now_s` as an argument; the
server calls `Simulation.step(now_s)` on its own clock and turns the outcome into HTTP responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """What one engine step did, for counters and the iteration histogram."""

    engine: int
    prompt_tokens_computed: int  # prefill tokens run this step (cached prefix tokens excluded)
    generation_tokens: int  # tokens decoded this step (one per running decode)
    batched_tokens: int  # prompt_tokens_computed + generation_tokens
    preemptions: int
    prefix_queries_tokens: int  # prompt tokens of requests scheduled for the first time this step
    prefix_hits_tokens: int  # of those, tokens found in the prefix cache (whole blocks)
    prefix_queries_blocks: int
    prefix_hits_blocks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FinishedRequest:
    """One finished request, for the per-request histograms and request_success."""

    engine: int
    finish_reason: FinishReason
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    n: int
    arrival_s: float
    first_scheduled_s: float | None  # None when it never ran (aborted while waiting)
    first_token_s: float | None
    finished_s: float
    num_preemptions: int
    cached_prompt_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineGauges:
    """One engine's instantaneous state, as vLLM's gauges would show it."""

    engine: int
    running: int
    waiting: int
    waiting_deferred: int
    kv_usage_ratio: float  # computed the way the chosen vLLM version computes it
    num_gpu_blocks: int  # this engine's blocks (the writer sums them for data-parallel cache_config_info)
    block_size: int
    num_cpu_blocks: int | None


class Recorder(Protocol):
    """Receives what happens, so the /metrics writer can keep counters and histograms."""

    def step_done(self, record: StepRecord) -> None: ...

    def request_finished(self, record: FinishedRequest) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcessState:
    pid: int
    name: str  # e.g. "VLLM::EngineCore" or "python tenant.py"
    used_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuState:
    """One simulated GPU as NVML would report it (served as JSON on /sim/gpu)."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    utilization_ratio: float
    temperature_celsius: float
    processes: tuple[GpuProcessState, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEvent:
    """New output tokens of one request in this step (the server streams them)."""

    request_id: str
    new_tokens: int
    finished: FinishReason | None = None


class DeathCause(StrEnum):
    CUDA_OOM = "cuda_oom"


@dataclass(frozen=True, slots=True, kw_only=True)
class Death:
    """The simulated engine died; `log_lines` are what vLLM prints, in order."""

    cause: DeathCause
    engine: int
    log_lines: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    duration_s: float  # how long this step takes in wall time (the server sleeps that long before the next)
    tokens: tuple[TokenEvent, ...] = ()
    death: Death | None = None
    hung: bool = False  # the engine stopped making progress (scenario `hang`): nothing advanced
    extra: dict[str, float] = field(default_factory=dict)
