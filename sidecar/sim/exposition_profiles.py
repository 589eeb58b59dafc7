"""Which `vllm:` families each simulated vLLM version defines, in vLLM's order, with its HELP texts and buckets.

Pure data. The names, types and label sets follow /work/shared/reference/vllm-metrics.md; the HELP texts and
bucket lists follow the real 0.32.0 capture and, for older versions, vLLM's source for that era (the same
sources the hand-written fixtures in tests/fixtures/expositions use). Families a version defines but never
fills in a plain deployment (V0 `tokens_total`, the OpenTelemetry-only `model_*_time_milliseconds`, spec
decoding, LoRA on V1) are left out: they would not show up on such a server's /metrics.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from functools import partial


class Version(StrEnum):
    V0_6 = "0.6"  # V0 engine, 0.6.6: model_name only, multiprocess registry (no _created, no python_/process_)
    V0_10 = "0.10"  # V1 engine, 0.10.2: old and new names side by side, single-process registry
    V0_32 = "0.32"  # V1 engine, 0.32.0: current names only, as the real capture


def parse_version(text: str) -> Version:
    """Accept "0.6", "0.6.6", "0.10.2", "v0.32.0" ...: the minor version picks the profile."""
    parts = text.removeprefix("v").split(".")
    try:
        return Version(".".join(parts[:2]))
    except ValueError:
        known = ", ".join(version.value for version in Version)
        raise ValueError(f"unsupported vLLM version {text!r}; the simulator knows {known}") from None


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class Scope(StrEnum):
    ENGINE = "engine"  # model_name (+ engine on V1) + extra labels; one series per engine
    MODEL = "model"  # model_name + extra labels, no engine even on V1 (admission_rejections)
    ENGINE_ONLY = "engine_only"  # engine alone, no model_name (engine_healthy, collected from the API server)
    LORA = "lora"  # V0 lora_requests_info: only the adapter labels
    CACHE_CONFIG = "cache_config"  # CacheConfig fields (+ engine on V1); built by the writer


@dataclass(frozen=True, slots=True)
class Family:
    kind: Kind
    name: str  # as vLLM passes it to prometheus_client; counters carry `_total`, which the library keeps
    help: str
    _: KW_ONLY
    scope: Scope = Scope.ENGINE
    buckets: tuple[float, ...] = ()
    extra_label: str | None = None  # e.g. finished_reason, source, reason, sleep_state
    precreated: tuple[str, ...] = ()  # extra label values V1 creates up front, in vLLM's order
    value_major: bool = False  # create `for value: for engine:` (request_success) instead of engine first


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50 ... up to `max_value` inclusive."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(float(value))
        exponent += 1


_TTFT_V0 = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_TTFT_V1 = (*_TTFT_V0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TPOT_V0 = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_TPOT_V1 = (*_TPOT_V0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY_V0 = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_LATENCY_V1 = (*_LATENCY_V0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_PARAMS_N = (1.0, 2.0, 5.0, 10.0, 20.0)
_NUM_PREEMPTIONS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
# V0 0.6.6 with its typos (8096, 16192); 0.10.2 on a GPU uses the CUDA-graph capture sizes; 0.32.0 the
# eager-mode list of the real (CPU) capture.
_ITERATION_V0_6 = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8096, 16192)
_ITERATION_V0_10 = (1, 2, 4, *range(8, 513, 8))
_ITERATION_V0_32 = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

FINISH_REASONS_V0_10 = ("stop", "length", "abort")
FINISH_REASONS_V0_32 = ("stop", "length", "abort", "error", "repetition")

_RUNNING_V1 = "Number of requests in model execution batches."
_WAITING = "Number of requests waiting to be processed."
_KV_USAGE = "KV-cache usage. 1 means 100 percent usage."
_PREFIX_QUERIES = "Prefix cache queries, in terms of number of queried tokens."
_PREFIX_HITS = "Prefix cache hits, in terms of number of cached tokens."
_PREEMPTIONS = "Cumulative number of preemption from the engine."
_PROMPT_TOKENS = "Number of prefill tokens processed."
_GENERATION_TOKENS = "Number of generation tokens processed."
_SUCCESS = "Count of successfully processed requests."
_ITERATION = "Histogram of number of tokens per engine_step."
_MAX_GENERATION = "Histogram of maximum number of requested generation tokens."
_PARAMS_N_HELP = "Histogram of the n request parameter."
_PARAMS_MAX_TOKENS = "Histogram of the max_tokens request parameter."
_TTFT = "Histogram of time to first token in seconds."
_TPOT = "Histogram of time per output token in seconds."
_ITL = "Histogram of inter-token latency in seconds."
_E2E_V1 = "Histogram of e2e request latency in seconds."
_QUEUE = "Histogram of time spent in WAITING phase for request."
_INFERENCE = "Histogram of time spent in RUNNING phase for request."
_PREFILL = "Histogram of time spent in PREFILL phase for request."
_DECODE = "Histogram of time spent in DECODE phase for request."
CACHE_CONFIG_HELP = "Information of the LLMEngine CacheConfig"
_MFU = " (for Model Flops Utilization calculations)."


# The `vllm:` gauges and counters, positional as (name, HELP), options by keyword.
_g = partial(Family, Kind.GAUGE)
_c = partial(Family, Kind.COUNTER)


def _h(name: str, help_text: str, buckets: tuple[float, ...]) -> Family:
    return Family(Kind.HISTOGRAM, name, help_text, buckets=tuple(float(bound) for bound in buckets))


def _request_histograms(
    max_model_len: int, *, iteration: tuple[float, ...], ttft: tuple[float, ...]
) -> tuple[Family, ...]:
    """The V1 block from request_prompt_tokens to time_to_first_token, in the order V1 defines it."""
    tokens = build_1_2_5_buckets(max_model_len)
    return (
        _h("vllm:request_prompt_tokens", _PROMPT_TOKENS, tokens),
        _h("vllm:request_generation_tokens", _GENERATION_TOKENS, tokens),
        _h("vllm:iteration_tokens_total", _ITERATION, iteration),
        _h("vllm:request_max_num_generation_tokens", _MAX_GENERATION, tokens),
        _h("vllm:request_params_n", _PARAMS_N_HELP, _PARAMS_N),
        _h("vllm:request_params_max_tokens", _PARAMS_MAX_TOKENS, tokens),
        _h("vllm:time_to_first_token_seconds", _TTFT, ttft),
    )


def _phase_histograms(latency: tuple[float, ...], e2e_help: str) -> tuple[Family, ...]:
    return (
        _h("vllm:e2e_request_latency_seconds", e2e_help, latency),
        _h("vllm:request_queue_time_seconds", _QUEUE, latency),
        _h("vllm:request_inference_time_seconds", _INFERENCE, latency),
        _h("vllm:request_prefill_time_seconds", _PREFILL, latency),
        _h("vllm:request_decode_time_seconds", _DECODE, latency),
    )


def _families_0_6(max_model_len: int) -> tuple[Family, ...]:
    # Multiprocess file order, as the 0.6.x fixtures show it: cache_config_info first, gauges, counters, histograms.
    tokens = build_1_2_5_buckets(max_model_len)
    return (
        _g("vllm:cache_config_info", CACHE_CONFIG_HELP, scope=Scope.CACHE_CONFIG),
        _g("vllm:num_requests_running", "Number of requests currently running on GPU."),
        _g("vllm:num_requests_swapped", "Number of requests swapped to CPU."),
        _g("vllm:num_requests_waiting", _WAITING),
        _g("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
        _g("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage."),
        _g("vllm:cpu_prefix_cache_hit_rate", "CPU prefix cache block hit rate."),
        _g("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate."),
        _g("vllm:avg_prompt_throughput_toks_per_s", "Average prefill throughput in tokens/s."),
        _g("vllm:avg_generation_throughput_toks_per_s", "Average generation throughput in tokens/s."),
        _g("vllm:lora_requests_info", "Running stats on lora requests.", scope=Scope.LORA),
        _c("vllm:num_preemptions_total", _PREEMPTIONS),
        _c("vllm:prompt_tokens_total", _PROMPT_TOKENS),
        _c("vllm:generation_tokens_total", _GENERATION_TOKENS),
        _c("vllm:request_success_total", _SUCCESS, extra_label="finished_reason"),
        _h("vllm:iteration_tokens_total", _ITERATION, _ITERATION_V0_6),
        _h("vllm:time_to_first_token_seconds", _TTFT, _TTFT_V0),
        _h("vllm:time_per_output_token_seconds", _TPOT, _TPOT_V0),
        *_phase_histograms(_LATENCY_V0, "Histogram of end to end request latency in seconds."),
        _h("vllm:time_in_queue_requests", "Histogram of time the request spent in the queue in seconds.", _LATENCY_V0),
        _h("vllm:request_prompt_tokens", _PROMPT_TOKENS, tokens),
        _h("vllm:request_generation_tokens", _GENERATION_TOKENS, tokens),
        _h("vllm:request_max_num_generation_tokens", _MAX_GENERATION, tokens),
        _h("vllm:request_params_n", _PARAMS_N_HELP, _PARAMS_N),
        _h("vllm:request_params_max_tokens", _PARAMS_MAX_TOKENS, tokens),
    )


_USE_KV = "Use vllm:kv_cache_usage_perc instead."
_GPU_QUERIES = "GPU prefix cache queries, in terms of number of queriedtokens."
_GPU_HITS = "GPU prefix cache hits, in terms of number of cached tokens."


def _families_0_10(max_model_len: int) -> tuple[Family, ...]:
    deprecated = " DEPRECATED: Use vllm:prefix_cache_{} instead."
    return (
        _g("vllm:num_requests_running", _RUNNING_V1),
        _g("vllm:num_requests_waiting", _WAITING),
        # vLLM concatenates these strings without a space; the HELP texts keep the typo.
        _g("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: " + _USE_KV),
        _c("vllm:gpu_prefix_cache_queries_total", _GPU_QUERIES + deprecated.format("queries")),
        _c("vllm:gpu_prefix_cache_hits_total", _GPU_HITS + deprecated.format("hits")),
        _g("vllm:kv_cache_usage_perc", _KV_USAGE),
        _c("vllm:prefix_cache_queries_total", _PREFIX_QUERIES),
        _c("vllm:prefix_cache_hits_total", _PREFIX_HITS),
        _c("vllm:num_preemptions_total", _PREEMPTIONS),
        _c("vllm:prompt_tokens_total", _PROMPT_TOKENS),
        _c("vllm:generation_tokens_total", _GENERATION_TOKENS),
        _c("vllm:request_success_total", _SUCCESS, extra_label="finished_reason", precreated=FINISH_REASONS_V0_10),
        *_request_histograms(max_model_len, iteration=_ITERATION_V0_10, ttft=_TTFT_V1),
        _h("vllm:time_per_output_token_seconds", _TPOT, _TPOT_V1),
        _h("vllm:inter_token_latency_seconds", _ITL, _TPOT_V1),
        *_phase_histograms(_LATENCY_V1, _E2E_V1),
        _g("vllm:cache_config_info", CACHE_CONFIG_HELP, scope=Scope.CACHE_CONFIG),
    )


_WAITING_BY_REASON = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)
_SLEEP_STATE = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
_CACHED_BY_SOURCE = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), "
    "disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to "
    "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
)
_EXTERNAL = "External prefix cache {} from KV connector cross-instance cache sharing, in terms of number of {} tokens."


def _families_0_32(max_model_len: int) -> tuple[Family, ...]:
    return (
        _c("vllm:estimated_flops_per_gpu_total", "Estimated number of floating point operations per GPU" + _MFU),
        _c("vllm:estimated_read_bytes_per_gpu_total", "Estimated number of bytes read from memory per GPU" + _MFU),
        _c("vllm:estimated_write_bytes_per_gpu_total", "Estimated number of bytes written to memory per GPU" + _MFU),
        _g("vllm:num_requests_running", _RUNNING_V1),
        _g("vllm:num_requests_waiting", _WAITING),
        _g(
            "vllm:num_requests_waiting_by_reason",
            _WAITING_BY_REASON,
            extra_label="reason",
            precreated=("capacity", "deferred"),
        ),
        _g(
            "vllm:engine_sleep_state",
            _SLEEP_STATE,
            extra_label="sleep_state",
            precreated=("awake", "weights_offloaded", "discard_all"),
        ),
        _g("vllm:kv_cache_usage_perc", _KV_USAGE),
        _c("vllm:prefix_cache_queries_total", _PREFIX_QUERIES),
        _c("vllm:prefix_cache_hits_total", _PREFIX_HITS),
        _c("vllm:external_prefix_cache_queries_total", _EXTERNAL.format("queries", "queried")),
        _c("vllm:external_prefix_cache_hits_total", _EXTERNAL.format("hits", "cached")),
        _c("vllm:mm_cache_queries_total", "Multi-modal cache queries, in terms of number of queried items."),
        _c("vllm:mm_cache_hits_total", "Multi-modal cache hits, in terms of number of cached items."),
        _c("vllm:num_preemptions_total", _PREEMPTIONS),
        _c("vllm:prompt_tokens_total", _PROMPT_TOKENS),
        _c(
            "vllm:prompt_tokens_by_source_total",
            "Number of prompt tokens by source.",
            extra_label="source",
            precreated=("local_compute", "local_cache_hit", "external_kv_transfer"),
        ),
        _c("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local + external)."),
        _c(
            "vllm:prompt_tokens_cached_by_source_total",
            _CACHED_BY_SOURCE,
            extra_label="source",
            precreated=("device", "host", "p2p", "disk", "external_unspecified"),
        ),
        _c("vllm:generation_tokens_total", _GENERATION_TOKENS),
        _c(
            "vllm:request_success_total",
            _SUCCESS,
            extra_label="finished_reason",
            precreated=FINISH_REASONS_V0_32,
            value_major=True,
        ),
        _c(
            "vllm:admission_rejections_total",
            "Number of admission attempts rejected by a queue limit, by reason.",
            scope=Scope.MODEL,
            extra_label="reason",
            precreated=("max_num_queued_reqs", "max_num_queued_tokens"),
        ),
        *_request_histograms(max_model_len, iteration=_ITERATION_V0_32, ttft=_TTFT_V1),
        _h("vllm:inter_token_latency_seconds", _ITL, _TPOT_V1),
        _h(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _TPOT_V1,
        ),
        *_phase_histograms(_LATENCY_V1, _E2E_V1),
        _h(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            _NUM_PREEMPTIONS,
        ),
        _h(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            build_1_2_5_buckets(max_model_len),
        ),
        _g("vllm:cache_config_info", CACHE_CONFIG_HELP, scope=Scope.CACHE_CONFIG),
    )


# vLLM main after 0.33.0, vllm/entrypoints/serve/instrumentator/metrics.py: a collector registered when /metrics is
# mounted, after every engine metric; one series per engine of this API server, only with --enable-fault-tolerance.
ENGINE_HEALTHY = _g(
    "vllm:engine_healthy", "Whether the engine reports healthy under fault tolerance.", scope=Scope.ENGINE_ONLY
)


def families(version: Version, max_model_len: int, *, fault_tolerance: bool = False) -> tuple[Family, ...]:
    """The families a plain `vllm serve` of `version` shows, in the order its /metrics lists them; with
    `fault_tolerance` (--enable-fault-tolerance, newest profile only) also vllm:engine_healthy, last."""
    if version is Version.V0_6:
        return _families_0_6(max_model_len)
    if version is Version.V0_10:
        return _families_0_10(max_model_len)
    return (*_families_0_32(max_model_len), *((ENGINE_HEALTHY,) if fault_tolerance else ()))
