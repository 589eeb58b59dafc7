"""Every metric the sidecar exports: name, type, labels and HELP, in one place (see the contract)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # for counters: without the `_total` that prometheus_client adds on exposition
    kind: Kind
    labels: tuple[str, ...]
    help: str

    @property
    def exposed_name(self) -> str:
        """The family name in the text exposition: an info metric gains `_info` (a counter's samples `_total`)."""
        return self.name + "_info" if self.kind is Kind.INFO else self.name


ENGINE = ("model_name", "engine")
GPU_RANK = ("gpu", "rank")
_PROBE = (
    " From the vllm_sidecar_probe plugin inside vLLM (PyTorch's caching allocator, torch.cuda.memory_stats), "
    "summed over the vLLM processes of that GPU and rank (rank 'none': a process outside torch.distributed)."
)
MODEL = ("model_name",)
GPU = ("gpu",)
SHORT_HORIZON = "the last 5 polls"  # DeriveSettings.short_horizon_polls; a test holds them together

UP = MetricSpec("vllm_sidecar_up", Kind.GAUGE, (), "1 when the last poll of vLLM's /metrics succeeded, else 0.")
SOURCE_SUCCESS = MetricSpec(
    "vllm_sidecar_source_success",
    Kind.GAUGE,
    ("source",),
    "1 when the last read of the source succeeded, else 0.",
)
SOURCE_DURATION = MetricSpec(
    "vllm_sidecar_source_duration_seconds",
    Kind.GAUGE,
    ("source",),
    "Seconds the last read of the source took.",
)
LAST_POLL = MetricSpec(
    "vllm_sidecar_last_poll_timestamp_seconds", Kind.GAUGE, (), "Unix time of the last completed poll."
)
BUILD_INFO = MetricSpec("vllm_sidecar_build", Kind.INFO, ("version",), "The sidecar's version; value is always 1.")
VLLM_HEALTHY = MetricSpec(
    "vllm_sidecar_vllm_healthy",
    Kind.GAUGE,
    (),
    "1 when vLLM's /health answered 200 at the last poll, else 0.",
)
VLLM_INFO = MetricSpec(
    "vllm_sidecar_vllm",
    Kind.INFO,
    ("version", "metric_schema"),
    "The vLLM version (from /version; empty when not offered) and the metric-name schema it exposes.",
)
PROBLEMS = MetricSpec(
    "vllm_sidecar_problems",
    Kind.GAUGE,
    (),
    "Number of things the last poll could not read or make sense of; /status lists them.",
)

KV_USAGE = MetricSpec(
    "vllm_sidecar_kv_cache_usage_ratio",
    Kind.GAUGE,
    ENGINE,
    "vLLM's KV-cache usage, 0..1 (vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc before 0.9.2).",
)
KV_CAPACITY = MetricSpec(
    "vllm_sidecar_kv_cache_capacity_blocks",
    Kind.GAUGE,
    ENGINE,
    "KV-cache blocks of this engine: num_gpu_blocks of vllm:cache_config_info divided by the engines of the "
    "server (vLLM sums it across data-parallel engines).",
)
KV_BLOCK_SIZE = MetricSpec(
    "vllm_sidecar_kv_cache_block_size_tokens", Kind.GAUGE, ENGINE, "Tokens per KV-cache block (block_size)."
)
KV_CAPACITY_TOKENS = MetricSpec(
    "vllm_sidecar_kv_cache_capacity_tokens",
    Kind.GAUGE,
    ENGINE,
    "KV-cache capacity of this engine in tokens: kv_cache_size_tokens of vllm:cache_config_info where vLLM "
    "reports it (0.24+, per engine, right for hybrid models whose blocks differ in size), else capacity blocks x "
    "block_size.",
)
KV_USED = MetricSpec(
    "vllm_sidecar_kv_cache_used_blocks",
    Kind.GAUGE,
    ENGINE,
    "KV-cache blocks requests hold, by vLLM's own arithmetic for its version: usage x (capacity - 1) from 0.10.2 "
    "(vLLM leaves its null block out), usage x capacity - 1 on 0.8.3-0.10.1 (it counts it as used), usage x "
    "capacity before and on V0.",
)
KV_PER_REQUEST = MetricSpec(
    "vllm_sidecar_kv_cache_blocks_per_request",
    Kind.GAUGE,
    ENGINE,
    "KV-cache blocks in use per running request; absent when nothing runs.",
)
KV_HEADROOM = MetricSpec(
    "vllm_sidecar_kv_cache_request_headroom",
    Kind.GAUGE,
    ENGINE,
    "How many more requests of today's average size fit in the free KV blocks (as vLLM counts them): free blocks "
    "/ blocks per request; absent when nothing runs.",
)
KV_FRAGMENTATION = MetricSpec(
    "vllm_sidecar_kv_cache_fragmentation_ratio",
    Kind.GAUGE,
    ENGINE,
    "Estimated share of used KV slots that hold no token: running x (block_size - 1) / 2 / (used blocks x "
    "block_size), assuming each request's last block is on average half empty; absent when no block is used. "
    "Not allocator fragmentation: PyTorch's caching allocator is seen in its OOM messages (doctor) and the "
    "allocator probe's vllm_sidecar_torch_* metrics.",
)
PREFIX_HIT_RATIO = MetricSpec(
    "vllm_sidecar_prefix_cache_hit_ratio",
    Kind.GAUGE,
    ENGINE,
    "Prefix-cache hits / queries over the sidecar's window (vLLM's own hit-rate gauge on V0); absent when no "
    "query happened in the window or prefix caching is off.",
)
ENGINE_STALLED = MetricSpec(
    "vllm_sidecar_engine_stalled_seconds",
    Kind.GAUGE,
    ENGINE,
    "Seconds since the engine last advanced its token or step counters while requests were running; 0 when "
    "idle or progressing.",
)

PREEMPTIONS_RATE = MetricSpec(
    "vllm_sidecar_preemptions_per_second",
    Kind.GAUGE,
    ENGINE,
    f"Requests vLLM preempted per second over {SHORT_HORIZON} (increase of vllm:num_preemptions_total): the rate "
    "the preemption pause rule judges; absent until two polls have read the counter.",
)
PREEMPTIONS_IN_WINDOW = MetricSpec(
    "vllm_sidecar_preemptions_in_window",
    Kind.GAUGE,
    ENGINE,
    "Requests vLLM preempted over the sidecar's --window (increase of vllm:num_preemptions_total, through "
    "restarts); absent until two polls have read the counter.",
)
WAITING_DEFERRED_RATIO = MetricSpec(
    "vllm_sidecar_requests_waiting_deferred_ratio",
    Kind.GAUGE,
    ENGINE,
    "Share of waiting requests vLLM defers for a transient constraint (LoRA budget, KV transfer, blocked) rather "
    "than for scheduling capacity (vllm:num_requests_waiting_by_reason, 0.20+); the queue pause rule counts only "
    "those waiting for capacity. Absent when nothing waits or vLLM does not split its queue.",
)
ENGINE_UNHEALTHY = MetricSpec(
    "vllm_sidecar_engine_unhealthy_seconds",
    Kind.GAUGE,
    ENGINE,
    "Seconds since vLLM's fault tolerance first reported this engine unhealthy or dead (vllm:engine_healthy 0; "
    "admission is paused meanwhile); 0 while healthy; absent without --enable-fault-tolerance.",
)
VLLM_REJECTIONS_RATE = MetricSpec(
    "vllm_sidecar_vllm_rejections_per_second",
    Kind.GAUGE,
    MODEL,
    f"Requests vLLM itself refused with 503 per second over {SHORT_HORIZON}, all reasons "
    "(--max-num-queued-reqs, --max-num-queued-tokens: increase of vllm:admission_rejections_total); absent "
    "before vLLM 0.32.",
)
VLLM_REJECTIONS_IN_WINDOW = MetricSpec(
    "vllm_sidecar_vllm_rejections_in_window",
    Kind.GAUGE,
    MODEL,
    "Requests vLLM itself refused with 503 over the sidecar's --window, all reasons (increase of "
    "vllm:admission_rejections_total); absent before vLLM 0.32.",
)

GPU_TOTAL = MetricSpec("vllm_sidecar_gpu_memory_total_bytes", Kind.GAUGE, GPU, "GPU memory in total (NVML).")
GPU_USED = MetricSpec("vllm_sidecar_gpu_memory_used_bytes", Kind.GAUGE, GPU, "GPU memory in use, by anyone (NVML).")
GPU_BUDGET = MetricSpec(
    "vllm_sidecar_gpu_memory_budget_bytes",
    Kind.GAUGE,
    GPU,
    "vLLM's memory budget on this GPU: gpu_memory_utilization x total.",
)
GPU_OVER_BUDGET = MetricSpec(
    "vllm_sidecar_gpu_memory_over_budget_bytes",
    Kind.GAUGE,
    GPU,
    "GPU memory used beyond vLLM's budget (used - budget); negative means room to spare.",
)
GPU_GROWTH = MetricSpec(
    "vllm_sidecar_gpu_memory_growth_bytes_per_second",
    Kind.GAUGE,
    GPU,
    "Trend of used GPU memory: least-squares slope over the memory-trend window, since the slope last changed.",
)
GPU_TIME_TO_OOM = MetricSpec(
    "vllm_sidecar_gpu_time_to_oom_seconds",
    Kind.GAUGE,
    GPU,
    "Forecast seconds until used memory reaches total at the current trend; absent when memory is not "
    "growing or the trend does not fit the data.",
)
GPU_PROCESS_MEMORY = MetricSpec(
    "vllm_sidecar_gpu_process_memory_bytes",
    Kind.GAUGE,
    ("gpu", "owner"),
    "GPU memory held by processes, by owner: vllm, other (another tenant), unknown (not visible from here).",
)
GPU_UTILIZATION = MetricSpec(
    "vllm_sidecar_gpu_utilization_ratio", Kind.GAUGE, GPU, "Share of time the GPU was busy, 0..1 (NVML)."
)
GPU_TEMPERATURE = MetricSpec("vllm_sidecar_gpu_temperature_celsius", Kind.GAUGE, GPU, "GPU temperature (NVML).")
GPU_XID = MetricSpec(
    "vllm_sidecar_gpu_xid_errors",
    Kind.COUNTER,
    GPU,
    "Critical Xid events the driver reported since the sidecar started.",
)
GPU_LAST_XID = MetricSpec("vllm_sidecar_gpu_last_xid", Kind.GAUGE, GPU, "Code of the last Xid event seen on the GPU.")

ADMISSION_PAUSED = MetricSpec(
    "vllm_sidecar_admission_paused",
    Kind.GAUGE,
    (),
    "1 while the policy pauses admission (/readyz answers 503 with the reason), else 0 (and 0 in dry-run).",
)
READY = MetricSpec(
    "vllm_sidecar_ready",
    Kind.GAUGE,
    (),
    "1 while /readyz answers 200: vLLM seen healthy within the last 3 polls and admission not paused, else 0.",
)
POLICY_STATE = MetricSpec(
    "vllm_sidecar_policy_state", Kind.GAUGE, ("state",), "1 for the policy's current state, 0 for the others."
)
ACTIONS = MetricSpec(
    "vllm_sidecar_actions",
    Kind.COUNTER,
    ("action",),
    "Actions the sidecar took (or, in dry-run, would have taken), by kind.",
)
ACTION_FAILURES = MetricSpec(
    "vllm_sidecar_action_failures", Kind.COUNTER, ("action",), "Actions that failed or were refused, by kind."
)
RESTARTS = MetricSpec(
    "vllm_sidecar_restarts", Kind.COUNTER, ("reason",), "Restarts of vLLM the sidecar performed, by reason."
)
LAST_RESTART = MetricSpec(
    "vllm_sidecar_last_restart_timestamp_seconds",
    Kind.GAUGE,
    (),
    "Unix time of the last restart of vLLM the sidecar performed (from the persisted ledger).",
)
RESTART_BUDGET_REMAINING = MetricSpec(
    "vllm_sidecar_restart_budget_remaining",
    Kind.GAUGE,
    (),
    "Restarts still allowed in the current hour before the budget is exhausted.",
)

PROBES = MetricSpec(
    "vllm_sidecar_probes",
    Kind.COUNTER,
    ("outcome",),
    "Engine probes (one 1-token completion after a while without engine progress) by outcome: answered, "
    "no_answer (a wedge unless the engine moved meanwhile), inconclusive (an HTTP error: no evidence).",
)

TORCH_ALLOCATED = MetricSpec(
    "vllm_sidecar_torch_allocated_bytes", Kind.GAUGE, GPU_RANK, "Bytes held by live tensors." + _PROBE
)
TORCH_RESERVED = MetricSpec(
    "vllm_sidecar_torch_reserved_bytes",
    Kind.GAUGE,
    GPU_RANK,
    "Bytes PyTorch's caching allocator holds from the driver (allocated plus cached)." + _PROBE,
)
TORCH_INACTIVE_SPLIT = MetricSpec(
    "vllm_sidecar_torch_inactive_split_bytes",
    Kind.GAUGE,
    GPU_RANK,
    "Reserved bytes in free pieces of split blocks: memory the allocator holds but cannot give to a request "
    "larger than the piece." + _PROBE,
)
TORCH_FRAGMENTATION = MetricSpec(
    "vllm_sidecar_torch_fragmentation_ratio",
    Kind.GAUGE,
    GPU_RANK,
    "Allocator fragmentation: inactive split bytes / reserved bytes; absent while nothing is reserved. This is "
    "the allocator's own view, unlike vllm_sidecar_kv_cache_fragmentation_ratio (empty slots of KV blocks)." + _PROBE,
)
TORCH_ALLOC_RETRIES = MetricSpec(
    "vllm_sidecar_torch_alloc_retries",
    Kind.COUNTER,
    GPU_RANK,
    "Allocations that failed, made the allocator free its cache and succeeded on retry: it is out of room for "
    "the next request's activations, the step before an OOM. Counts since each vLLM process started." + _PROBE,
)
TORCH_OOMS = MetricSpec(
    "vllm_sidecar_torch_ooms",
    Kind.COUNTER,
    GPU_RANK,
    "Allocations that failed even after the retry (CUDA out of memory raised in vLLM). Counts since each vLLM "
    "process started." + _PROBE,
)

INCIDENTS = MetricSpec(
    "vllm_sidecar_incidents",
    Kind.COUNTER,
    ("trigger",),
    "Incident folders kept (docs/incidents.md), by trigger: before_restart (vLLM's processes still there) or "
    "after_crash (vLLM died and came back without the sidecar).",
)
INCIDENT_PARTS_MISSING = MetricSpec(
    "vllm_sidecar_incident_parts_missing",
    Kind.COUNTER,
    ("kind",),
    "Parts an incident could not keep, by kind (stacks, log, metrics, status_history): stacks are missing where "
    "py-spy is not installed or the sidecar may not read vLLM's processes (SYS_PTRACE, a shared process namespace).",
)
REMEDIATIONS = MetricSpec(
    "vllm_sidecar_remediations",
    Kind.COUNTER,
    ("flag", "outcome"),
    "Changes to vLLM's flags for its next start (--remediate, docs/remediation.md), by flag and outcome: applied "
    "(in dry-run: would_apply), confirmed (healthy through the window), reverted (did not help: a person must "
    "decide), refused (a fix the guard rails did not allow).",
)
REMEDIATION_PENDING = MetricSpec(
    "vllm_sidecar_remediation_pending",
    Kind.GAUGE,
    (),
    "1 while a change to vLLM's flags waits to prove itself (vLLM healthy within the start timeout, the same "
    "cause not back within --remediate-window), else 0.",
)
REMEDIATION_FLAG_VALUE = MetricSpec(
    "vllm_sidecar_remediation_flag_value",
    Kind.GAUGE,
    ("flag",),
    "The value the sidecar sets for a flag of vLLM's next start (its flags file); absent for a flag it does not set.",
)

POLICY = (
    ADMISSION_PAUSED,
    READY,
    POLICY_STATE,
    ACTIONS,
    ACTION_FAILURES,
    RESTARTS,
    LAST_RESTART,
    RESTART_BUDGET_REMAINING,
    PROBES,
    INCIDENTS,
    INCIDENT_PARTS_MISSING,
    REMEDIATIONS,
    REMEDIATION_PENDING,
    REMEDIATION_FLAG_VALUE,
)

ALL = (
    UP,
    SOURCE_SUCCESS,
    SOURCE_DURATION,
    LAST_POLL,
    BUILD_INFO,
    VLLM_HEALTHY,
    VLLM_INFO,
    PROBLEMS,
    KV_USAGE,
    KV_CAPACITY,
    KV_CAPACITY_TOKENS,
    KV_BLOCK_SIZE,
    KV_USED,
    KV_PER_REQUEST,
    KV_HEADROOM,
    KV_FRAGMENTATION,
    PREFIX_HIT_RATIO,
    ENGINE_STALLED,
    PREEMPTIONS_RATE,
    PREEMPTIONS_IN_WINDOW,
    WAITING_DEFERRED_RATIO,
    ENGINE_UNHEALTHY,
    VLLM_REJECTIONS_RATE,
    VLLM_REJECTIONS_IN_WINDOW,
    GPU_TOTAL,
    GPU_USED,
    GPU_BUDGET,
    GPU_OVER_BUDGET,
    GPU_GROWTH,
    GPU_TIME_TO_OOM,
    GPU_PROCESS_MEMORY,
    GPU_UTILIZATION,
    GPU_TEMPERATURE,
    GPU_XID,
    GPU_LAST_XID,
    TORCH_ALLOCATED,
    TORCH_RESERVED,
    TORCH_INACTIVE_SPLIT,
    TORCH_FRAGMENTATION,
    TORCH_ALLOC_RETRIES,
    TORCH_OOMS,
)
