"""The simulated vLLM's /metrics: prometheus_client metrics named, labelled and filled the way vLLM fills them.

`MetricsWriter` is the simulation's `Recorder`: the engine reports each step and each finished request,
the HTTP server calls `render` with the engines' current gauges and serves the bytes with `content_type`.
Like vLLM it uses prometheus_client's Gauge, Counter and Histogram, on a registry of its own. It reads
the clock only through prometheus_client (`_created`, `lora_requests_info`) and, when `render` is given
no `now_s`, for V0's 5-second average-throughput gauges. It shares no code with the sidecar's parser.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from sidecar.sim.exposition_cache import CacheSettings, EngineCache, cache_config_labels
from sidecar.sim.exposition_multiprocess import MultiprocessView
from sidecar.sim.exposition_profiles import Family, Kind, Scope, Version, families, parse_version
from sidecar.sim.records import EngineGauges, FinishedRequest, FinishReason, StepRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_V0_LOCAL_LOG_INTERVAL_S = 5.0  # V0 refreshes its average-throughput gauges at most this often
_LORA_LABELS = ("running_lora_adapters", "max_lora", "waiting_lora_adapters")

__all__ = ["CONTENT_TYPE", "CacheSettings", "MetricsWriter"]


class MetricsWriter:
    """Keeps one simulated vLLM's metrics. Not thread-safe beyond what prometheus_client guarantees."""

    def __init__(
        self, version: str, *, model_name: str, cache: CacheSettings, engines: int = 1, fault_tolerance: bool = False
    ) -> None:
        self.version = parse_version(version)
        if engines < 1 or (self.version is Version.V0_6 and engines != 1):
            raise ValueError(f"vLLM {self.version} cannot run {engines} engines behind one server")
        if fault_tolerance and self.version is not Version.V0_32:
            raise ValueError(f"vLLM {self.version} has no --enable-fault-tolerance")
        self._v1 = self.version is not Version.V0_6
        self._model_name = model_name
        self._engines = engines
        self._cache = cache
        self._registry = CollectorRegistry()
        if self._v1:
            # What a single-process vLLM's default registry carries, in the order the real capture lists it.
            GCCollector(registry=self._registry)
            PlatformCollector(registry=self._registry)
            ProcessCollector(registry=self._registry)
        self._families = families(self.version, cache.max_model_len, fault_tolerance=fault_tolerance)
        self._by_name = {family.name: family for family in self._families}
        self._engine_cache = {
            engine: EngineCache(
                num_gpu_blocks=cache.num_gpu_blocks_per_engine,
                block_size=cache.block_size,
                num_cpu_blocks=cache.num_cpu_blocks,
            )
            for engine in range(engines)
        }
        self._cache_labelnames = self._cache_config_labelnames()
        self._cache_series: dict[int, dict[str, str]] = {}
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        self._metrics: dict[str, Gauge | Counter | Histogram] = {}
        for family in self._families:
            self._build(family)
        # V0 block-level prefix-cache totals (for the hit-rate gauge) and the throughput window.
        self._prefix_queries_blocks = 0
        self._prefix_hits_blocks = 0
        self._window_start_s: float | None = None
        self._window_prompt_tokens = 0
        self._window_generation_tokens = 0
        self._precreate()
        self._publish_cache_config()

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE

    def step_done(self, record: StepRecord) -> None:
        engine = self._check_engine(record.engine)
        hits = record.prefix_hits_tokens
        # Prompt tokens count whole prompts, cached prefix included (V1 adds prompt_len at the first token).
        prompt = record.prompt_tokens_computed + hits
        self._inc("vllm:prompt_tokens_total", engine, prompt)
        self._inc("vllm:generation_tokens_total", engine, record.generation_tokens)
        self._inc("vllm:num_preemptions_total", engine, record.preemptions)
        for name in ("vllm:gpu_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"):
            self._inc(name, engine, record.prefix_queries_tokens)
        for name in ("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total"):
            self._inc(name, engine, hits)
        self._inc("vllm:prompt_tokens_by_source_total", engine, record.prompt_tokens_computed, "local_compute")
        self._inc("vllm:prompt_tokens_by_source_total", engine, hits, "local_cache_hit")
        self._inc("vllm:prompt_tokens_cached_total", engine, hits)
        self._inc("vllm:prompt_tokens_cached_by_source_total", engine, hits, "device")
        # 0.32 counts the tokens actually computed; V0 and 0.10 whole prompts plus generated tokens.
        computed_only = self.version is Version.V0_32
        step_tokens = record.batched_tokens if computed_only else prompt + record.generation_tokens
        self._observe("vllm:iteration_tokens_total", engine, step_tokens)
        self._prefix_queries_blocks += record.prefix_queries_blocks
        self._prefix_hits_blocks += record.prefix_hits_blocks
        self._window_prompt_tokens += prompt
        self._window_generation_tokens += record.generation_tokens

    def request_finished(self, record: FinishedRequest) -> None:
        engine = self._check_engine(record.engine)
        self._inc("vllm:request_success_total", engine, 1, self._finish_reason(record.finish_reason))
        self._observe("vllm:e2e_request_latency_seconds", engine, record.finished_s - record.arrival_s)
        if record.first_scheduled_s is not None:
            queued_s = record.first_scheduled_s - record.arrival_s
            self._observe("vllm:request_queue_time_seconds", engine, queued_s)
            self._observe("vllm:time_in_queue_requests", engine, queued_s)
            self._observe("vllm:request_inference_time_seconds", engine, record.finished_s - record.first_scheduled_s)
        if record.first_token_s is not None:
            self._observe("vllm:time_to_first_token_seconds", engine, record.first_token_s - record.arrival_s)
            decode_s = record.finished_s - record.first_token_s
            self._observe("vllm:request_decode_time_seconds", engine, decode_s)
            if record.first_scheduled_s is not None:
                prefill_s = record.first_token_s - record.first_scheduled_s
                self._observe("vllm:request_prefill_time_seconds", engine, prefill_s)
            # One inter-token interval per token after the first, spread evenly over the decode phase.
            intervals = record.generation_tokens - 1
            per_token_s = decode_s / intervals if intervals > 0 else 0.0
            for name in ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"):
                self._observe(name, engine, per_token_s, times=max(intervals, 0))
            self._observe("vllm:request_time_per_output_token_seconds", engine, per_token_s)
        self._observe("vllm:request_prompt_tokens", engine, record.prompt_tokens)
        self._observe("vllm:request_generation_tokens", engine, record.generation_tokens)
        self._observe("vllm:request_max_num_generation_tokens", engine, record.generation_tokens)
        self._observe("vllm:request_params_n", engine, record.n)
        self._observe("vllm:request_params_max_tokens", engine, record.max_tokens)
        self._observe("vllm:request_num_preemptions", engine, record.num_preemptions)
        computed = record.prompt_tokens - record.cached_prompt_tokens
        self._observe("vllm:request_prefill_kv_computed_tokens", engine, computed)

    def admission_rejected(self, reason: str) -> None:
        """The API server refused a request by a queue cap (HTTP 503); `reason` is vLLM's label value."""
        self._inc("vllm:admission_rejections_total", 0, 1, reason)

    def engine_health(self, engine: int, *, healthy: bool) -> None:
        """What fault tolerance reports for `engine` (shown only with fault tolerance on)."""
        self._set("vllm:engine_healthy", self._check_engine(engine), 1 if healthy else 0)

    def render(self, gauges: Sequence[EngineGauges], *, now_s: float | None = None) -> bytes:
        """Set the gauges from the engines' state and return the text exposition.

        `now_s` (monotonic seconds) only drives V0's average-throughput gauges; it defaults to the clock.
        """
        for state in gauges:
            engine = self._check_engine(state.engine)
            self._engine_cache[engine] = EngineCache(
                num_gpu_blocks=state.num_gpu_blocks, block_size=state.block_size, num_cpu_blocks=state.num_cpu_blocks
            )
            self._set("vllm:num_requests_running", engine, state.running)
            self._set("vllm:num_requests_waiting", engine, state.waiting)
            # `waiting` is the total; 0.20+ splits it into capacity + deferred.
            self._set(
                "vllm:num_requests_waiting_by_reason",
                engine,
                max(state.waiting - state.waiting_deferred, 0),
                "capacity",
            )
            self._set("vllm:num_requests_waiting_by_reason", engine, state.waiting_deferred, "deferred")
            self._set("vllm:gpu_cache_usage_perc", engine, state.kv_usage_ratio)
            self._set("vllm:kv_cache_usage_perc", engine, state.kv_usage_ratio)
        if not self._v1:
            self._render_v0_gauges(time.monotonic() if now_s is None else now_s)
        self._publish_cache_config()
        if self._v1:
            return generate_latest(self._registry)
        return generate_latest(MultiprocessView(self._registry))

    def _render_v0_gauges(self, now_s: float) -> None:
        self._set("vllm:num_requests_swapped", 0, 0)  # the simulator never swaps to CPU
        self._set("vllm:cpu_cache_usage_perc", 0, 0.0)
        if not self._cache.enable_prefix_caching:
            gpu_hit_ratio = cpu_hit_ratio = -1.0  # what V0 reports with prefix caching off
        else:
            queries = self._prefix_queries_blocks
            gpu_hit_ratio = self._prefix_hits_blocks / queries if queries else 0.0
            cpu_hit_ratio = 0.0
        self._set("vllm:gpu_prefix_cache_hit_rate", 0, gpu_hit_ratio)
        self._set("vllm:cpu_prefix_cache_hit_rate", 0, cpu_hit_ratio)
        if self._window_start_s is None:
            self._window_start_s = now_s
            self._set("vllm:avg_prompt_throughput_toks_per_s", 0, 0.0)
            self._set("vllm:avg_generation_throughput_toks_per_s", 0, 0.0)
        elif now_s - self._window_start_s > _V0_LOCAL_LOG_INTERVAL_S:
            elapsed_s = now_s - self._window_start_s
            self._set("vllm:avg_prompt_throughput_toks_per_s", 0, self._window_prompt_tokens / elapsed_s)
            self._set("vllm:avg_generation_throughput_toks_per_s", 0, self._window_generation_tokens / elapsed_s)
            self._window_start_s = now_s
            self._window_prompt_tokens = self._window_generation_tokens = 0
        # V0 logs the LoRA state on every stats pass with the wall-clock time as value; no LoRA: max_lora="0".
        lora = self._gauges["vllm:lora_requests_info"]
        lora.labels(running_lora_adapters="", max_lora="0", waiting_lora_adapters="").set_to_current_time()

    def _build(self, family: Family) -> None:
        labelnames = self._labelnames(family)
        metric: Gauge | Counter | Histogram
        if family.kind is Kind.GAUGE:
            metric = self._gauges[family.name] = Gauge(family.name, family.help, labelnames, registry=self._registry)
        elif family.kind is Kind.COUNTER:
            metric = self._counters[family.name] = Counter(
                family.name, family.help, labelnames, registry=self._registry
            )
        else:
            metric = self._histograms[family.name] = Histogram(
                family.name, family.help, labelnames, registry=self._registry, buckets=family.buckets
            )
        self._metrics[family.name] = metric

    def _labelnames(self, family: Family) -> list[str]:
        if family.scope is Scope.LORA:
            return list(_LORA_LABELS)
        if family.scope is Scope.CACHE_CONFIG:
            return self._cache_labelnames
        if family.scope is Scope.ENGINE_ONLY:
            return ["engine"]
        names = ["model_name"]
        if family.scope is Scope.ENGINE and self._v1:
            names.append("engine")
        if family.extra_label is not None:
            names.append(family.extra_label)
        return names

    def _cache_config_labelnames(self) -> list[str]:
        names = list(cache_config_labels(self.version, self._cache, engine=self._engine_cache[0], total_gpu_blocks=0))
        return [*names, "engine"] if self._v1 else names

    def _precreate(self) -> None:
        """Create the series vLLM creates before the first request: every engine's, on V1."""
        if not self._v1:
            # V0 increments these on its first stats pass, which runs even while idle.
            for name in ("vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
                self._inc(name, 0, 0)
            return
        for family in self._families:
            if family.scope in (Scope.LORA, Scope.CACHE_CONFIG):
                continue
            engines = range(self._engines) if family.scope in (Scope.ENGINE, Scope.ENGINE_ONLY) else range(1)
            values: tuple[str | None, ...] = family.precreated or (None,)
            if family.value_major:
                pairs = [(engine, value) for value in values for engine in engines]
            else:
                pairs = [(engine, value) for engine in engines for value in values]
            metric = self._metrics[family.name]
            for engine, value in pairs:
                metric.labels(*self._label_values(family, engine, value))
        for engine in range(self._engines):
            self._set("vllm:engine_sleep_state", engine, 1, "awake")  # the simulated engines never sleep
            self._set("vllm:engine_healthy", engine, 1)  # absent without fault tolerance: then this does nothing

    def _publish_cache_config(self) -> None:
        """One series per engine; `num_gpu_blocks` is the sum over engines, as V1's handshake adds them up."""
        gauge = self._gauges["vllm:cache_config_info"]
        total_blocks = sum(cache.num_gpu_blocks for cache in self._engine_cache.values())
        for engine, cache in self._engine_cache.items():
            labels = cache_config_labels(self.version, self._cache, engine=cache, total_gpu_blocks=total_blocks)
            if self._v1:
                labels["engine"] = str(engine)
            previous = self._cache_series.get(engine)
            if previous == labels:
                continue
            if previous is not None:
                gauge.remove(*(previous[name] for name in self._cache_labelnames))
            gauge.labels(**labels).set(1.0)
            self._cache_series[engine] = labels

    def _label_values(self, family: Family, engine: int, extra: str | None) -> list[str]:
        if family.scope is Scope.ENGINE_ONLY:
            return [str(engine)]
        values = [self._model_name]
        if family.scope is Scope.ENGINE and self._v1:
            values.append(str(engine))
        if family.extra_label is not None:
            if extra is None:
                raise ValueError(f"{family.name} needs a {family.extra_label} value")
            values.append(extra)
        return values

    def _set(self, name: str, engine: int, value: float, extra: str | None = None) -> None:
        gauge = self._gauges.get(name)
        if gauge is not None:  # absent: this version has no such family
            gauge.labels(*self._label_values(self._by_name[name], engine, extra)).set(value)

    def _inc(self, name: str, engine: int, amount: float, extra: str | None = None) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.labels(*self._label_values(self._by_name[name], engine, extra)).inc(amount)

    def _observe(self, name: str, engine: int, value: float, *, times: int = 1) -> None:
        histogram = self._histograms.get(name)
        if histogram is None or times <= 0:
            return
        child = histogram.labels(*self._label_values(self._by_name[name], engine, None))
        for _ in range(times):
            child.observe(value)

    def _check_engine(self, engine: int) -> int:
        if not 0 <= engine < self._engines:
            raise ValueError(f"engine {engine} is out of range: this server runs {self._engines} engine(s)")
        return engine

    def _finish_reason(self, reason: FinishReason) -> str:
        # Before 0.11 vLLM has no "error" finish reason; such requests end as aborted.
        if self.version is not Version.V0_32 and reason is FinishReason.ERROR:
            return "abort"
        return reason.value
