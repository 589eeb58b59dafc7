"""What the vLLM source reports for one tick, interpreted per engine. Pure data, no I/O.

A value vLLM did not report is `None`, never 0: an idle engine and a silent one must not look alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MetricSchema(StrEnum):
    """Which generation of vLLM metric names a server exposes (see docs: metric schemas)."""

    V0 = "v0"  # 0.5-0.10 V0 engine: gpu_cache_usage_perc, gpu_prefix_cache_hit_rate gauge, no engine label
    V1_LEGACY = "v1-legacy"  # V1 0.7.3-0.11: gpu_cache_usage_perc, gpu_prefix_cache_{queries,hits}_total
    V1 = "v1"  # V1 >= 0.9.2: kv_cache_usage_perc, prefix_cache_{queries,hits}_total
    UNRECOGNISED = "unrecognised"  # vllm: families, but neither KV-usage gauge
    NO_VLLM_METRICS = "no-vllm-metrics"  # reachable, but no vllm: family (e.g. --disable-log-stats)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The labels of `vllm:cache_config_info` the sidecar uses, for one engine."""

    num_gpu_blocks_server: int | None  # as vLLM reports it: summed over the data-parallel engines of the server
    engines_in_server: int  # how many engines report a cache_config_info series on this server
    block_size_tokens: int | None
    gpu_memory_utilization: float | None
    enable_prefix_caching: bool | None
    kv_cache_size_tokens: int | None  # 0.24+, per engine


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineMetrics:
    """The raw vLLM values of one (model_name, engine) for one scrape."""

    model_name: str
    engine: str
    kv_cache_usage_ratio: float | None
    requests_running: float | None
    requests_waiting: float | None
    requests_swapped: float | None
    cache_config: CacheConfig | None
    # Prefix cache: counters (tokens on >= 0.9, blocks on V1 <= 0.8) or, on V0, vLLM's own hit-rate gauge.
    prefix_cache_queries_total: float | None
    prefix_cache_hits_total: float | None
    prefix_cache_hit_rate_gauge: float | None  # V0 only; -1 means prefix caching is disabled
    preemptions_total: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    iterations_total: float | None  # the count of vllm:iteration_tokens_total: one per engine step
    # vllm:num_requests_waiting_by_reason (0.20+): waiting for scheduling capacity, and deferred by a transient
    # constraint (LoRA budget, KV transfer, blocked); they add up to requests_waiting. None before 0.20.
    requests_waiting_capacity: float | None = None
    requests_waiting_deferred: float | None = None
    # vllm:engine_healthy (vLLM main after 0.33.0, only with --enable-fault-tolerance): False while vLLM's fault
    # tolerance reports the engine unhealthy or dead (vLLM then answers 503 itself); None when not exported.
    engine_healthy: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelMetrics:
    """The server-level vLLM values of one served model (no engine label): vLLM's own admission control."""

    model_name: str
    # vllm:admission_rejections_total (0.32+): requests vLLM refused with 503 by its --max-num-queued-reqs /
    # --max-num-queued-tokens caps, summed over reasons, and per reason as vLLM labels them.
    admission_rejections_total: float | None
    admission_rejections_by_reason: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmReading:
    """A successful read of one vLLM server's /metrics (and /version where offered)."""

    url: str
    version: str | None  # from /version; None when the server does not offer it
    schema: MetricSchema
    engines: tuple[EngineMetrics, ...]
    problems: tuple[str, ...] = ()
    # In-flight requests at the API server (vLLM's /load, counted with --enable-server-load-tracking); asked
    # only while the engines' gauges read idle, where it tells a quiet engine from one whose requests hang.
    # None when not asked or not offered.
    server_load: int | None = None
    models: tuple[ModelMetrics, ...] = ()  # server-level values per model_name (vLLM 0.32+); () before

    @property
    def shows_vllm(self) -> bool:
        """Whether the server shows itself as vLLM: vllm: series in /metrics, or a version from /version (a vLLM
        started with --disable-log-stats exports no vllm: series, but still names its version)."""
        return self.schema is not MetricSchema.NO_VLLM_METRICS or self.version is not None
