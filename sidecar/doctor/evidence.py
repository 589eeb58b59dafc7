"""Everything the doctor was given, as read: vLLM live, the GPUs, the log, the sidecar's history. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.traffic import Traffic
from sidecar.model.gpu import GpuReading
from sidecar.model.vllm import VllmReading


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveEvidence:
    url: str
    reachable: bool  # /metrics answered (even if what it said was unusable)
    error: str | None  # one line when /metrics could not be read or understood
    version: str | None  # GET /version
    max_model_len: int | None  # GET /v1/models
    reading: VllmReading | None
    traffic: Traffic | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEvidence:
    source: str  # nvml, sim or none
    reading: GpuReading | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorHistory:
    """PyTorch's allocator on one GPU and rank as the daemon's allocator probe last read it (/status allocators)."""

    gpu: int
    rank: str
    reserved_bytes: int
    inactive_split_bytes: int
    alloc_retries_total: int  # since each vLLM process started
    ooms_total: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTrend:
    """One GPU's memory trend as the sidecar daemon measured it over its window."""

    gpu: int
    growth_bytes_per_second: float | None
    fit_r2: float | None
    time_to_oom_s: float | None
    # The same /status entry's memory at the daemon's last poll (None when the history did not say).
    total_bytes: int | None = None
    used_bytes: int | None = None
    budget_bytes: int | None = None  # gpu_memory_utilization x total
    vllm_bytes: int | None = None
    other_bytes: int | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineHistory:
    """One engine as the daemon's /status showed it at its last poll."""

    label: str  # "engine 0", or "engine llama/0" with several models
    stalled_s: float | None  # engine_stalled_seconds: no progress with work to do
    since_progress_s: float | None  # seconds_since_progress: no progress at all, idle or not
    running: float | None
    waiting: float | None
    kv_usage: float | None
    capacity_blocks: int | None
    block_size: int | None
    blocks_per_request: float | None
    preemptions_per_second: float | None
    preemptions_in_window: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEvent:
    """One of the policy's recent decisions that did something (pause, drain, restart, notify)."""

    wall_time_s: float | None
    state: str
    actions: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyHistory:
    state: str | None
    reason: str | None  # the current decision's reason
    readiness: str | None  # why /readyz answers what it answers
    would_restart_but: str | None
    restarts: tuple[tuple[str, int], ...]
    recent: tuple[PolicyEvent, ...]
    probes: tuple[tuple[str, int], ...]  # engine probe answers by outcome
    last_probe: str | None
    last_restart_wall_time_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryFacts:
    source: str
    prefix_hit_ratio_window: float | None  # the lowest engine's, over the daemon's window
    preemptions_per_second: float | None  # the highest engine's, over the last few polls (what the policy judges)
    gpus: tuple[GpuTrend, ...]
    restarts: tuple[tuple[str, int], ...]  # (reason, count) of the sidecar's restarts of vLLM
    # From a /status document only (a restart ledger has none of these):
    polled_at_s: float | None = None  # the daemon's last poll, wall-clock seconds
    vllm_version: str | None = None
    vllm_healthy: bool | None = None
    engines: tuple[EngineHistory, ...] = ()
    policy: PolicyHistory | None = None
    allocators: tuple[AllocatorHistory, ...] = ()  # with the daemon's --probe-dir


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    live: LiveEvidence
    gpu: GpuEvidence
    log: LogFacts | None
    log_path: str | None
    history: HistoryFacts | None
    problems: tuple[str, ...] = ()  # what could not be read, one line each
