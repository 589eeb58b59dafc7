"""The `/status` and `once --json` documents: one schema, written by `report` and read by the doctor. Pure.

Each document is a TypedDict, so mypy holds the writer (`sidecar/report/document.py`) and every reader (the
doctor's history rules) to the same keys and types. A document from outside (a URL, a saved file) is checked
against the same classes where it is read in (`sidecar/doctor_cli/history_reading.py`, with pydantic's
TypeAdapter): the pure core never sees an unchecked one. A value that cannot be known is `None` (JSON null),
never 0 (`../shared/contract.md`).
"""

from __future__ import annotations

from typing import NotRequired

# typing_extensions: pydantic validates a TypedDict from typing only on Python 3.12+ (the doctor checks documents
# from outside against these classes).
from typing_extensions import TypedDict


class VllmStatus(TypedDict):
    url: str
    reachable: bool
    healthy: bool | None
    version: str | None
    metric_schema: str | None


class EngineOnce(TypedDict):
    """One engine's instantaneous values: what a single poll can know."""

    model_name: str
    engine: str
    kv_cache_usage_ratio: float | None
    kv_cache_capacity_blocks: int | None
    kv_cache_block_size_tokens: int | None
    kv_cache_used_blocks: float | None
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_blocks_per_request: float | None
    kv_cache_request_headroom: float | None
    kv_cache_fragmentation_ratio: float | None
    prefix_cache_hit_ratio_lifetime: float | None
    # Beyond the contract's fields: vLLM's queue split (0.20+), its fault tolerance's verdict, token capacity.
    requests_waiting_capacity: float | None
    requests_waiting_deferred: float | None
    engine_healthy: bool | None
    kv_cache_capacity_tokens: int | None
    kv_cache_free_blocks: float | None


class EngineStatus(EngineOnce):
    """One engine as the daemon sees it over its window."""

    prefix_cache_hit_ratio: float | None
    preemptions_per_second: float | None
    engine_stalled_seconds: float | None
    preemptions_in_window: float | None
    requests_waiting_deferred_ratio: float | None
    engine_unhealthy_seconds: float | None
    seconds_since_progress: float | None  # idle or not: an idle wedge shows only here


class GpuProcessStatus(TypedDict):
    pid: int
    name: str | None
    owner: str  # "vllm", "other" or "unknown"
    used_memory_bytes: int | None


class GpuStatus(TypedDict):
    gpu: int
    uuid: str | None
    name: str | None
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    memory_budget_bytes: int | None
    memory_over_budget_bytes: int | None
    memory_growth_bytes_per_second: float | None
    memory_growth_fit_r2: float | None
    time_to_oom_seconds: float | None
    vllm_process_memory_bytes: int | None
    other_process_memory_bytes: int | None
    unknown_process_memory_bytes: int | None
    utilization_ratio: float | None
    temperature_celsius: float | None
    xid_errors_total: int | None
    last_xid: int | None
    processes: list[GpuProcessStatus]


class ModelOnce(TypedDict):
    model_name: str
    admission_rejections_total: float | None
    admission_rejections_by_reason: dict[str, float | None]


class ModelStatus(ModelOnce):
    admission_rejections_per_second: float | None
    admission_rejections_in_window: float | None


class AllocatorStatus(TypedDict):
    gpu: int
    rank: str
    processes: int
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int
    fragmentation_ratio: float | None
    alloc_retries_total: int
    ooms_total: int
    alloc_retries_recent: int | None
    ooms_recent: int | None


class OnceDocument(TypedDict):
    vllm: VllmStatus
    engines: list[EngineOnce]
    gpus: list[GpuStatus]
    problems: list[str]
    models: list[ModelOnce]
    allocators: list[AllocatorStatus]


class SidecarStatus(TypedDict):
    version: str
    last_poll_timestamp_seconds: NotRequired[float | None]  # absent before the first poll


class SourceStatus(TypedDict):
    ok: bool
    duration_seconds: float | None
    error: str | None


class RecentDecision(TypedDict):
    """A decision of the policy that did something (pause, drain, restart, notify)."""

    wall_time_s: float | None
    state: str
    actions: list[str]
    causes: list[str | None]  # the rule or restart reason of each action (None for a manual one)
    reason: str
    dry_run: bool


class FlagChangeStatus(TypedDict):
    flag: str
    value: object
    why: str


class CrashCauseStatus(TypedDict):
    cause: str | None
    severity: str | None
    summary: str
    evidence: list[str]
    recommendations: list[FlagChangeStatus]
    steps: list[str]
    source: str
    read_timestamp_seconds: float


class IncidentStatus(TypedDict):
    """The last incident folder the sidecar wrote (docs/incidents.md)."""

    path: str
    cause: str  # the restart reason, or "vllm_died"
    timestamp_seconds: float


class RemediationStepStatus(TypedDict):
    flag: str
    change: str  # "--max-model-len 2048 -> 992"
    before: float
    after: float
    cause: str
    why: str  # the doctor's arithmetic
    state: str  # pending, confirmed, reverted
    outcome: str
    timestamp_seconds: float
    resolved_timestamp_seconds: float | None
    held: bool


class RemediationStatus(TypedDict):
    """--remediate (docs/remediation.md): what may change, what vLLM's next start gets, the recent steps."""

    allowed: list[str]  # "--max-model-len 1024..32768"
    flags_file: str
    flags: dict[str, float]
    steps: list[RemediationStepStatus]  # the newest, oldest first
    last_refusal: str | None
    problem: str | None


class PolicyStatus(TypedDict):
    state: str
    admission_paused: bool
    ready: bool
    readiness: str
    reason: str
    would_restart_but: str | None
    cooldown_remaining_seconds: float | None
    restarts_in_budget_window: int
    restart_budget_remaining: int
    last_restart_timestamp_seconds: float | None
    dry_run: bool
    actuator: str
    actions: dict[str, int]
    failures: dict[str, int]
    restarts: dict[str, int]
    recent: list[RecentDecision]
    probes: dict[str, int]
    last_probe: str | None
    last_probe_duration_seconds: float | None
    crash_cause: CrashCauseStatus | None
    last_incident: IncidentStatus | None
    remediation: RemediationStatus | None  # null: --remediate is off


class StatusDocument(TypedDict):
    """GET /status once the daemon has polled (before that: `StartingStatus`)."""

    sidecar: SidecarStatus
    sources: dict[str, SourceStatus]
    vllm: VllmStatus
    engines: list[EngineStatus]
    gpus: list[GpuStatus]
    problems: list[str]
    models: list[ModelStatus]
    allocators: list[AllocatorStatus]
    policy: NotRequired[PolicyStatus]  # absent in a dry view with no acting (never in the daemon)


class StartingStatus(TypedDict):
    """GET /status before the first poll."""

    sidecar: SidecarStatus
    state: str
    policy: NotRequired[PolicyStatus]
