"""What the sidecar adds to vLLM's own numbers, for one tick. Pure data; see the contract for definitions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineDerived:
    model_name: str
    engine: str
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_usage_ratio: float | None
    kv_cache_capacity_blocks: int | None
    kv_cache_block_size_tokens: int | None
    kv_cache_used_blocks: float | None
    kv_cache_blocks_per_request: float | None
    kv_cache_request_headroom: float | None
    kv_cache_fragmentation_ratio: float | None
    prefix_cache_hit_ratio: float | None  # over the window
    prefix_cache_hit_ratio_lifetime: float | None  # since vLLM started
    preemptions_per_second: float | None  # over the short horizon (the last few polls): what the policy judges
    engine_stalled_seconds: float | None  # None when progress cannot be judged (no counters)
    # Since the counters last moved, work or not (an engine wedged while idle looks idle); None without counters.
    seconds_since_progress: float | None = None
    # vLLM's split of requests_waiting (0.20+); None when vLLM does not split its queue.
    requests_waiting_capacity: float | None = None  # waiting for scheduling capacity (KV blocks, max_num_seqs)
    requests_waiting_deferred: float | None = None  # held back by a transient constraint (LoRA, KV transfer)
    requests_waiting_deferred_ratio: float | None = None  # deferred / waiting; None when nothing waits
    engine_healthy: bool | None = None  # vLLM's fault tolerance (vllm:engine_healthy); None without it
    engine_unhealthy_seconds: float | None = None  # since vLLM first reported it unhealthy; 0 while healthy
    preemptions_in_window: float | None = None  # preemptions counted over the window
    kv_cache_capacity_tokens: int | None = None  # kv_cache_size_tokens where vLLM reports it, else blocks x size
    kv_cache_free_blocks: float | None = None  # blocks a new request can get, as vLLM counts them
    # vLLM's own count of tokens generated since it started: 0 on a fresh vLLM no request has reached yet.
    generation_tokens_total: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDerived:
    gpu: int
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    memory_budget_bytes: int | None  # vLLM's gpu_memory_utilization x total
    memory_over_budget_bytes: int | None  # used - budget: memory outside vLLM's reservation when positive
    memory_growth_bytes_per_second: float | None  # least-squares slope of used memory since it last changed
    memory_growth_fit_r2: float | None
    time_to_oom_seconds: float | None  # (total - used) / growth, when growth is positive and the fit holds
    vllm_process_memory_bytes: int | None
    other_process_memory_bytes: int | None
    unknown_process_memory_bytes: int | None
    utilization_ratio: float | None
    temperature_celsius: float | None
    xid_errors_total: int | None
    last_xid: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDerived:
    """Server-level values of one served model: vLLM's own admission control (--max-num-queued-*, 0.32+)."""

    model_name: str
    admission_rejections_total: float | None  # vLLM's counter, all reasons, since vLLM started
    admission_rejections_by_reason: tuple[tuple[str, float], ...]  # vLLM's counter per reason label
    admission_rejections_per_second: float | None  # over the short horizon (the last few polls)
    admission_rejections_in_window: float | None  # counted over the window


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorDerived:
    """PyTorch's CUDA allocator on one GPU for one rank, from the allocator probe (summed over the processes of
    that GPU and rank: an API server and an engine core both without a rank, say)."""

    gpu: int
    rank: str  # torch.distributed's rank, or "none" for a process outside it
    processes: int
    allocated_bytes: int
    reserved_bytes: int
    inactive_split_bytes: int
    fragmentation_ratio: float | None  # inactive split / reserved; None while nothing is reserved
    alloc_retries_total: int
    ooms_total: int
    # Increase over the short horizon (the last few polls), each process compared with itself; None until a
    # sample of these processes from the start of the horizon exists. Retries rising is the allocator flushing
    # its cache to find room: the step before an OOM.
    alloc_retries_recent: int | None
    ooms_recent: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Derived:
    engines: tuple[EngineDerived, ...]
    gpus: tuple[GpuDerived, ...]
    problems: tuple[str, ...]
    models: tuple[ModelDerived, ...] = ()
    allocators: tuple[AllocatorDerived, ...] = ()
