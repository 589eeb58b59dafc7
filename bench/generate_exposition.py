"""Synthetic vLLM 0.32 ``/metrics`` expositions of realistic size, for parser benchmarks.

Family set, HELP texts, bucket lists, label order and number formatting follow the real vLLM 0.32 capture
``tests/fixtures/expositions/vllm-0.32.0-cpu-under-load.prom`` (prometheus_client's 0.0.4 text format:
``<base>_total`` counters with a ``<base>_created`` gauge family, sorted labels), with every engine-scoped
series repeated for each data-parallel engine behind one API server. ``vllm:cache_config_info`` has one series
per engine, each carrying the block count summed over all engines, as vLLM reports it.

Values are pseudo-random, fully determined by ``seed``, and consistent the way vLLM's are: cumulative
buckets, ``+Inf`` bucket = ``_count``, iteration tokens = computed prompt tokens + generated tokens,
inter-token count = generated tokens - first tokens. Pure: only the ``__main__`` entry point writes (stdout).
Size with the defaults: about 20 KB of per-server families plus 46 KB per engine (66 KB for 1 engine, 204 KB
for 4, 389 KB for 8; 6 engines give about 300 KB and 13 about 600 KB).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 131072
BLOCK_SIZE = 16
BLOCKS_PER_ENGINE = 29_491
START_TIME_S = 1_795_600_000.0

Labels = dict[str, str]


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(item) for item in text.split())


_TTFT = _floats("0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560")
_ITL = _floats("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80")
_LAT = _floats("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680")
_ITER = _floats("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384")
_HTTP_HIGHR = _floats("0.01 0.025 0.05 0.075 0.1 0.25 0.5 0.75 1 1.5 2 2.5 3 3.5 4 4.5 5 7.5 10 30 60")
_TOK = None  # vLLM's 1-2-5 token buckets up to max_model_len
_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# Per-engine histograms in exposition order: (name after "vllm:", buckets, HELP)
_HISTOGRAMS: tuple[tuple[str, tuple[float, ...] | None, str], ...] = (
    ("request_prompt_tokens", _TOK, "Number of prefill tokens processed."),
    ("request_generation_tokens", _TOK, "Number of generation tokens processed."),
    ("iteration_tokens_total", _ITER, "Histogram of number of tokens per engine_step."),
    ("request_max_num_generation_tokens", _TOK, "Histogram of maximum number of requested generation tokens."),
    ("request_params_n", _floats("1 2 5 10 20"), "Histogram of the n request parameter."),
    ("request_params_max_tokens", _TOK, "Histogram of the max_tokens request parameter."),
    ("time_to_first_token_seconds", _TTFT, "Histogram of time to first token in seconds."),
    ("inter_token_latency_seconds", _ITL, "Histogram of inter-token latency in seconds."),
    ("request_time_per_output_token_seconds", _ITL, "Histogram of time_per_output_token_seconds per request."),
    ("e2e_request_latency_seconds", _LAT, "Histogram of e2e request latency in seconds."),
    ("request_queue_time_seconds", _LAT, "Histogram of time spent in WAITING phase for request."),
    ("request_inference_time_seconds", _LAT, "Histogram of time spent in RUNNING phase for request."),
    ("request_prefill_time_seconds", _LAT, "Histogram of time spent in PREFILL phase for request."),
    ("request_decode_time_seconds", _LAT, "Histogram of time spent in DECODE phase for request."),
    (
        "request_num_preemptions",
        _floats("1 2 3 4 5 10 20"),
        "Histogram of the number of times a request was preempted.",
    ),
    (
        "request_prefill_kv_computed_tokens",
        _TOK,
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
)

_HELP = {
    "estimated": "Estimated number of {} per GPU (for Model Flops Utilization calculations).",
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
    "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
    "status). Sum of all reasons equals vllm:num_requests_waiting.",
    "sleep": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "kv": "KV-cache usage. 1 means 100 percent usage.",
    "cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
    "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. "
    "Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    "http_size": "Content length of {} by handler. Only value of header is respected. "
    "Otherwise ignored. No percentile calculated. ",
    "highr": "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
    "lowr": "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
}
_EXTERNAL = "from KV connector cross-instance cache sharing, in terms of number of"

# CacheConfig.metrics_info() of vLLM 0.32 (36 labels); the per-engine values are filled in by _cache_config().
_CACHE_CONFIG_TEXT = (
    "_block_size_resolved=True cache_dtype=auto cache_hit_alignment_tokens=None "
    "enable_mamba_shared_prefix_checkpoint=False enable_prefix_caching=True gpu_memory_utilization=0.9 "
    "hash_block_size=None is_attention_free=False kv_cache_dtype_skip_layers=[] kv_cache_layout=None "
    "kv_cache_memory_bytes=None kv_offloading_backend=native kv_offloading_size=None "
    "kv_sharing_fast_prefill=False mamba_block_size=None mamba_cache_dtype=auto mamba_cache_mode=none "
    "mamba_page_size_padded=None mamba_ssm_cache_dtype=auto num_cpu_blocks=None "
    "num_gpu_blocks_override=None prefix_cache_retention_interval=0 prefix_caching_hash_algo=sha256 "
    "prefix_match_unit=None replayssm_buffer_len=16 skip_page_size_padded=None sliding_window=None "
    "swa_bounded_replay=True use_kda_recoverssm=False use_replayssm=False user_specified_block_size=False"
)
_CACHE_CONFIG = dict(item.split("=", 1) for item in _CACHE_CONFIG_TEXT.split())


def token_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def format_value(value: float) -> str:
    """A sample value the way prometheus_client prints it (Go-style exponent from 7 integer digits on)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last one is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += times
        self.total += value * times


@dataclass(slots=True)
class _Engine:
    """Everything one engine has done so far: the values behind its series."""

    running: int
    waiting: int
    deferred: int
    used_blocks: int
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FINISH_REASONS, 0))
    hist: dict[str, _Histogram] = field(default_factory=dict)


def _simulate_request(rng: random.Random, engine: _Engine, *, finished: bool) -> None:
    hist = engine.hist
    prompt = int(rng.lognormvariate(7.0, 0.8)) % 12_000 + 16
    cached = int(prompt * rng.uniform(0.0, 0.9)) // BLOCK_SIZE * BLOCK_SIZE if rng.random() < 0.7 else 0
    max_tokens = rng.choice((256, 512, 1024, 2048))
    generated = rng.randint(8, max_tokens) if finished else rng.randint(0, max_tokens - 1)
    engine.prompt_tokens += prompt
    engine.cached_tokens += cached
    engine.generation_tokens += generated
    hist["iteration_tokens_total"].observe(prompt - cached)  # the prefill step; decode steps come later
    itl = rng.gammavariate(6.0, rng.uniform(0.015, 0.05) / 6.0)
    queue = rng.expovariate(1 / 0.4) if engine.waiting else rng.uniform(0.0001, 0.01)
    prefill = (prompt - cached) * rng.uniform(0.00003, 0.0001) + rng.uniform(0.01, 0.04)
    decode = 0.0
    if generated:
        hist["time_to_first_token_seconds"].observe(queue + prefill + 0.003)
        gaps = generated - 1
        fast, slow = int(gaps * 0.15), int(gaps * 0.10)
        for factor, times in ((0.6, fast), (1.0, gaps - fast - slow), (2.2, slow)):
            hist["inter_token_latency_seconds"].observe(itl * factor, times)
            decode += itl * factor * times
    if not finished:
        return
    reason = "length" if generated == max_tokens else rng.choices(("stop", "abort"), (0.98, 0.02))[0]
    engine.finished[reason] += 1
    preempted = float(rng.random() < 0.01)
    engine.preemptions += int(preempted)
    for name, value in (
        ("request_prompt_tokens", prompt),
        ("request_generation_tokens", generated),
        ("request_max_num_generation_tokens", max_tokens),
        ("request_params_n", 1),
        ("request_params_max_tokens", max_tokens),
        ("request_time_per_output_token_seconds", decode / max(1, generated - 1)),
        ("e2e_request_latency_seconds", queue + prefill + decode + 0.005),
        ("request_queue_time_seconds", queue),
        ("request_inference_time_seconds", prefill + decode),
        ("request_prefill_time_seconds", prefill),
        ("request_decode_time_seconds", decode),
        ("request_num_preemptions", preempted),
        ("request_prefill_kv_computed_tokens", prompt - cached),
    ):
        hist[name].observe(float(value))


def _simulate_engine(rng: random.Random) -> _Engine:
    running = rng.randint(4, 96)
    waiting = rng.choice((0, 0, rng.randint(1, 40)))
    engine = _Engine(
        running=running,
        waiting=waiting,
        deferred=min(waiting, rng.randint(0, 2)),
        used_blocks=rng.randint(BLOCKS_PER_ENGINE // 10, BLOCKS_PER_ENGINE),
    )
    tokens = token_buckets(MAX_MODEL_LEN)
    engine.hist = {name: _Histogram(buckets or tokens) for name, buckets, _ in _HISTOGRAMS}
    for _ in range(rng.randint(400, 900)):
        _simulate_request(rng, engine, finished=True)
    for _ in range(running):
        _simulate_request(rng, engine, finished=False)
    if waiting:
        engine.preemptions += rng.randint(0, 30)  # preempted requests that have not finished yet
    decode_left = engine.generation_tokens  # each decode step emits one token per running request
    while decode_left > 0:
        step = min(decode_left, rng.randint(max(1, running // 2), running))
        engine.hist["iteration_tokens_total"].observe(float(step))
        decode_left -= step
    return engine


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Writer:
    """Accumulates the exposition, one family at a time, as prometheus_client's generate_latest writes it."""

    def __init__(self, clock_s: float, rng: random.Random) -> None:
        self.lines: list[str] = []
        self.clock_s = clock_s
        self.rng = rng

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Labels, value: float) -> None:
        if labels:
            inner = ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))
            self.lines.append(f"{name}{{{inner}}} {format_value(value)}")
        else:
            self.lines.append(f"{name} {format_value(value)}")

    def created(self, base: str, help_text: str, series: Sequence[Labels]) -> None:
        self.family(f"{base}_created", "gauge", help_text)
        for labels in series:
            self.clock_s += self.rng.uniform(0.000008, 0.000026)
            self.sample(f"{base}_created", labels, self.clock_s)

    def gauge(self, name: str, help_text: str, series: Sequence[tuple[Labels, float]]) -> None:
        self.family(name, "gauge", help_text)
        for labels, value in series:
            self.sample(name, labels, value)

    def counter(self, base: str, help_text: str, series: Sequence[tuple[Labels, float]]) -> None:
        self.family(f"{base}_total", "counter", help_text)
        for labels, value in series:
            self.sample(f"{base}_total", labels, value)
        self.created(base, help_text, [labels for labels, _ in series])

    def histogram(self, base: str, help_text: str, series: Sequence[tuple[Labels, _Histogram]]) -> None:
        self.family(base, "histogram", help_text)
        for labels, hist in series:
            cumulative = 0
            for bound, count in zip((*hist.bounds, math.inf), hist.counts, strict=True):
                cumulative += count
                self.sample(f"{base}_bucket", {**labels, "le": format_value(bound)}, cumulative)
            self.sample(f"{base}_count", labels, cumulative)
            self.sample(f"{base}_sum", labels, hist.total)
        self.created(base, help_text, [labels for labels, _ in series])


def _process_families(out: _Writer, rng: random.Random) -> None:
    gc_families = (
        ("python_gc_objects_collected", "Objects collected during gc", (30_000, 5_000, 2_000)),
        ("python_gc_objects_uncollectable", "Uncollectable objects found during GC", (0, 0, 0)),
        ("python_gc_collections", "Number of times this generation was collected", (3_000, 280, 25)),
    )
    for name, help_text, scale in gc_families:
        series = [({"generation": str(g)}, float(int(s * rng.uniform(0.5, 1.5)))) for g, s in enumerate(scale)]
        out.family(f"{name}_total", "counter", help_text)
        for labels, value in series:
            out.sample(f"{name}_total", labels, value)
    python = {
        "implementation": "CPython",
        "major": "3",
        "minor": "12",
        "patchlevel": "3",
        "version": "3.12.3",
    }
    out.gauge("python_info", "Python platform information", [(python, 1.0)])
    for name, kind, help_text, value in (
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            rng.randint(20, 40) * 2**30,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            rng.randint(2, 8) * 2**29,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            round(out.clock_s - 61.3, 2),
        ),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            round(rng.uniform(500.0, 20_000.0), 2),
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors.", rng.randint(60, 200)),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", 1_048_576),
    ):
        out.family(name, kind, help_text)
        out.sample(name, {}, float(value))


def _engine_series(out: _Writer, engines: Sequence[_Engine], labels: Sequence[Labels]) -> None:
    pairs = list(zip(labels, engines, strict=True))
    for kind, text in (("flops", "floating point operations"), ("read_bytes", "bytes read from memory")):
        out.counter(f"vllm:estimated_{kind}_per_gpu", _HELP["estimated"].format(text), [(la, 0.0) for la in labels])
    text = "bytes written to memory"
    out.counter("vllm:estimated_write_bytes_per_gpu", _HELP["estimated"].format(text), [(la, 0.0) for la in labels])
    out.gauge("vllm:num_requests_running", _HELP["running"], [(la, e.running) for la, e in pairs])
    out.gauge("vllm:num_requests_waiting", _HELP["waiting"], [(la, e.waiting) for la, e in pairs])
    by_reason = [(("capacity", e.waiting - e.deferred), ("deferred", e.deferred)) for e in engines]
    out.gauge(
        "vllm:num_requests_waiting_by_reason",
        _HELP["waiting_by_reason"],
        [({**la, "reason": r}, v) for la, reasons in zip(labels, by_reason, strict=True) for r, v in reasons],
    )
    states = ("awake", "weights_offloaded", "discard_all")
    out.gauge(
        "vllm:engine_sleep_state",
        _HELP["sleep"],
        [({**la, "sleep_state": s}, s == "awake") for la in labels for s in states],
    )
    out.gauge("vllm:kv_cache_usage_perc", _HELP["kv"], [(la, e.used_blocks / BLOCKS_PER_ENGINE) for la, e in pairs])
    zero = [0] * len(engines)
    for base, help_text, values in (
        (
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [e.prompt_tokens for e in engines],
        ),
        (
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [e.cached_tokens for e in engines],
        ),
        ("external_prefix_cache_queries", f"External prefix cache queries {_EXTERNAL} queried tokens.", zero),
        ("external_prefix_cache_hits", f"External prefix cache hits {_EXTERNAL} cached tokens.", zero),
        ("mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", zero),
        ("mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", zero),
        (
            "num_preemptions",
            "Cumulative number of preemption from the engine.",
            [e.preemptions for e in engines],
        ),
        ("prompt_tokens", "Number of prefill tokens processed.", [e.prompt_tokens for e in engines]),
    ):
        out.counter(f"vllm:{base}", help_text, [(la, float(v)) for la, v in zip(labels, values, strict=True)])
    sources = [(e.prompt_tokens - e.cached_tokens, e.cached_tokens, 0) for e in engines]
    names = ("local_compute", "local_cache_hit", "external_kv_transfer")
    out.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        [
            ({**la, "source": n}, float(v))
            for la, vs in zip(labels, sources, strict=True)
            for n, v in zip(names, vs, strict=True)
        ],
    )
    out.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        [(la, float(e.cached_tokens)) for la, e in pairs],
    )
    tiers = ("device", "host", "p2p", "disk", "external_unspecified")
    out.counter(
        "vllm:prompt_tokens_cached_by_source",
        _HELP["cached_by_source"],
        [({**la, "source": t}, float(e.cached_tokens if t == "device" else 0)) for la, e in pairs for t in tiers],
    )
    gen = [(la, float(e.generation_tokens)) for la, e in pairs]
    out.counter("vllm:generation_tokens", "Number of generation tokens processed.", gen)
    success = [({**la, "finished_reason": r}, float(e.finished[r])) for r in _FINISH_REASONS for la, e in pairs]
    out.counter("vllm:request_success", "Count of successfully processed requests.", success)


def _cache_config(engine: int, engines: int) -> Labels:
    tokens = BLOCKS_PER_ENGINE * BLOCK_SIZE
    labels = dict(_CACHE_CONFIG)
    labels |= {"block_size": str(BLOCK_SIZE), "effective_attention_block_size": str(BLOCK_SIZE)}
    labels |= {"kv_cache_size_tokens": str(tokens), "kv_cache_max_concurrency": str(tokens / MAX_MODEL_LEN)}
    labels |= {"num_gpu_blocks": str(BLOCKS_PER_ENGINE * engines), "engine": str(engine)}
    return labels


def _lora_series(count: int, clock_s: float) -> list[tuple[Labels, float]]:
    names = [f"adapter-{i}" for i in range(count)]
    return [
        (
            {
                "max_lora": str(count),
                "running_lora_adapters": ",".join(names[: i + 1]),
                "waiting_lora_adapters": names[i + 1] if i + 1 < count else "",
            },
            clock_s + 37.5 * i,
        )
        for i in range(count)
    ]


def _http_families(out: _Writer, engines: Sequence[_Engine], rng: random.Random) -> None:
    finished = sum(sum(e.finished.values()) for e in engines)
    handlers = (("/v1/chat/completions", "POST", finished), ("/v1/models", "GET", rng.randint(1, 5)))
    requests = [({"handler": h, "method": m, "status": "2xx"}, float(n)) for h, m, n in handlers]
    out.counter("http_requests", "Total number of requests by method, status and handler.", requests)
    for name, direction, per_request in (
        ("request", "incoming requests", 4_100.0),
        ("response", "outgoing responses", 1_950.0),
    ):
        help_text = _HELP["http_size"].format(direction)
        out.family(f"http_{name}_size_bytes", "summary", help_text)
        for handler, _, n in handlers:
            total = float(round(n * per_request * rng.uniform(0.8, 1.2)))
            out.sample(f"http_{name}_size_bytes_count", {"handler": handler}, float(n))
            out.sample(f"http_{name}_size_bytes_sum", {"handler": handler}, total)
        out.created(f"http_{name}_size_bytes", help_text, [{"handler": h} for h, _, _ in handlers])
    latency = engines[0].hist["e2e_request_latency_seconds"]
    mean_s = latency.total / max(1, sum(latency.counts))
    highr = _Histogram(_HTTP_HIGHR)
    lowr = {h: _Histogram((0.1, 0.5, 1.0)) for h, _, _ in handlers}
    for handler, method, n in handlers:
        for _ in range(n):
            value = rng.expovariate(1 / mean_s) if method == "POST" else rng.uniform(0.001, 0.003)
            highr.observe(value)
            lowr[handler].observe(value)
    out.histogram("http_request_duration_highr_seconds", _HELP["highr"], [({}, highr)])
    lowr_series = [({"handler": h, "method": m}, lowr[h]) for h, m, _ in handlers]
    out.histogram("http_request_duration_seconds", _HELP["lowr"], lowr_series)


def generate_exposition(
    *, engines: int = 4, lora_adapters: int = 0, seed: int = 0, model_name: str = DEFAULT_MODEL_NAME
) -> str:
    """The /metrics body of one vLLM 0.32 API server with ``engines`` data-parallel engines."""
    if engines < 1:
        raise ValueError("engines must be at least 1")
    if lora_adapters < 0:
        raise ValueError("lora_adapters must not be negative")
    rng = random.Random(seed)
    sims = [_simulate_engine(random.Random(seed * 1_000_003 + index)) for index in range(engines)]
    out = _Writer(START_TIME_S + rng.uniform(0.0, 86_400.0), rng)
    _process_families(out, rng)
    labels = [{"engine": str(index), "model_name": model_name} for index in range(engines)]
    _engine_series(out, sims, labels)
    queue_limits = [
        ({"model_name": model_name, "reason": r}, 0.0) for r in ("max_num_queued_reqs", "max_num_queued_tokens")
    ]
    out.counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        queue_limits,
    )
    for name, _, help_text in _HISTOGRAMS:
        out.histogram(f"vllm:{name}", help_text, [(la, e.hist[name]) for la, e in zip(labels, sims, strict=True)])
    if lora_adapters:
        lora = _lora_series(lora_adapters, out.clock_s + 120.0)
        out.gauge("vllm:lora_requests_info", "Running stats on lora requests.", lora)
    cache = [(_cache_config(index, engines), 1.0) for index in range(engines)]
    out.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", cache)
    _http_families(out, sims, rng)
    return "\n".join(out.lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print a synthetic vLLM 0.32 /metrics exposition to stdout.")
    parser.add_argument("--engines", type=int, default=4, help="data-parallel engines behind the API server")
    parser.add_argument("--lora-adapters", type=int, default=0, help="adapters listed in vllm:lora_requests_info")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes")
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    args = parser.parse_args(argv)
    body = generate_exposition(
        engines=args.engines, lora_adapters=args.lora_adapters, seed=args.seed, model_name=args.model_name
    )
    sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
