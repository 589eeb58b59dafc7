"""Interpret a parsed vLLM exposition per engine, across every metric schema from 0.5 to 0.33. Pure.

Each logical value has an ordered list of candidate names (current first, older after), so one reader
serves every version; see `docs/metric-schemas.md` for the table this encodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sidecar.model.exposition import Exposition, Sample
from sidecar.model.vllm import CacheConfig, EngineMetrics, MetricSchema, ModelMetrics, VllmReading
from sidecar.parse.pick import SamplePicker

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SWAPPED = "vllm:num_requests_swapped"
CACHE_CONFIG = "vllm:cache_config_info"
MAX_LABEL_INT = 2**53  # every integer up to it is exact in a float64 sample value
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES_OLD = "vllm:gpu_prefix_cache_queries_total"
PREFIX_HITS_OLD = "vllm:gpu_prefix_cache_hits_total"
PREFIX_HIT_RATE_V0 = "vllm:gpu_prefix_cache_hit_rate"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
ITERATIONS = "vllm:iteration_tokens_total_count"
CPU_CACHE_USAGE_V0 = "vllm:cpu_cache_usage_perc"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # 0.20+: reason="capacity" | "deferred"
ADMISSION_REJECTIONS = "vllm:admission_rejections_total"  # 0.32+: model_name and reason, no engine label
ENGINE_HEALTHY = "vllm:engine_healthy"  # main after 0.33.0, with --enable-fault-tolerance: engine label only
WAITING_CAPACITY = "capacity"
WAITING_DEFERRED = "deferred"

KEPT_SAMPLES = frozenset(
    {
        KV_USAGE,
        KV_USAGE_OLD,
        RUNNING,
        WAITING,
        SWAPPED,
        CACHE_CONFIG,
        PREFIX_QUERIES,
        PREFIX_HITS,
        PREFIX_QUERIES_OLD,
        PREFIX_HITS_OLD,
        PREFIX_HIT_RATE_V0,
        PREEMPTIONS,
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        ITERATIONS,
        WAITING_BY_REASON,
        ADMISSION_REJECTIONS,
        ENGINE_HEALTHY,
    }
)
"""The sample names the sidecar reads: the daemon's picker parses these lines only (`vllm_sample_picker`), the
doctor passes them to `parse_exposition` to skip the rest of what it does not read."""
# Names whose presence alone tells something (detect_schema): noticed, never parsed.
PROMPT_TOKENS_CREATED = "vllm:prompt_tokens_created"  # a V1 sign in 0.8.x, which still used the old names
NOTICED_NAMES = frozenset({PROMPT_TOKENS_CREATED})
VLLM_PREFIX = "vllm:"


def vllm_sample_picker() -> SamplePicker:
    """What the daemon's tick reads of an exposition, without checking the families it does not read."""
    return SamplePicker(KEPT_SAMPLES, notice=NOTICED_NAMES, notice_prefixes=(VLLM_PREFIX,))


_ENGINE_SCOPED = (KV_USAGE, KV_USAGE_OLD, RUNNING, WAITING)
EngineKey = tuple[str, str]


def read_vllm(exposition: Exposition, *, url: str, version: str | None) -> VllmReading:
    """Turn one exposition into per-engine metrics; what cannot be read becomes a problem line."""
    problems: list[str] = []
    schema = detect_schema(exposition)
    if schema is MetricSchema.NO_VLLM_METRICS:
        problems.append(_no_vllm_series(url, version))
        return VllmReading(url=url, version=version, schema=schema, engines=(), problems=tuple(problems))
    if schema is MetricSchema.UNRECOGNISED:
        problems.append(
            f"vLLM /metrics has neither {KV_USAGE} nor {KV_USAGE_OLD}: KV-cache usage unknown "
            "(an unsupported vLLM version, or a server that is not vLLM)"
        )
    cache_configs = _read_cache_configs(exposition.get(CACHE_CONFIG), problems)
    values = _ValuesByEngine(exposition)
    keys = sorted(_engine_keys(exposition), key=_engine_sort_key)
    healthy = _engine_health(exposition.get(ENGINE_HEALTHY), {engine for _, engine in keys}, problems)
    engines = tuple(_read_engine(values, key, cache_configs, healthy) for key in keys)
    if not exposition.get(CACHE_CONFIG) and engines:
        problems.append(f"vLLM /metrics has no {CACHE_CONFIG}: KV-cache capacity and block size unknown")
    for engine in engines:
        config = engine.cache_config
        if config is not None and config.num_gpu_blocks_server is None:
            problems.append(
                # !r: the engine label is vLLM's text, and a problem is one line (a "\n" in it would forge a log line)
                f"vLLM reports num_gpu_blocks=None for engine {engine.engine!r} (vLLM 0.8.x publishes it before "
                "the engine has sized its cache): KV-cache capacity unknown"
            )
    models = _read_models(exposition.get(ADMISSION_REJECTIONS))
    return VllmReading(
        url=url, version=version, schema=schema, engines=engines, problems=tuple(problems), models=models
    )


def _no_vllm_series(url: str, version: str | None) -> str:
    """An exposition without vllm: series: vLLM's with --disable-log-stats, which still names its version at
    /version, or another program's."""
    if version is None:
        return f"{url} answers, but is not vLLM: its /metrics has no vllm: series and /version no version"
    return (
        "vLLM /metrics has no vllm: metric family (is vLLM started with --disable-log-stats?): "
        "nothing about the engine can be derived"
    )


def detect_schema(exposition: Exposition) -> MetricSchema:
    if not exposition.has_name_with_prefix(VLLM_PREFIX):
        return MetricSchema.NO_VLLM_METRICS
    if exposition.get(KV_USAGE):
        return MetricSchema.V1
    old_usage = exposition.get(KV_USAGE_OLD)
    if not old_usage:
        return MetricSchema.UNRECOGNISED
    # V1 before 0.9.2 is told from V0 by what only one of them ever emitted.
    v1_signs = (
        any(sample.label("engine") is not None for sample in old_usage)
        or bool(exposition.get(PREFIX_QUERIES_OLD))
        or PROMPT_TOKENS_CREATED in exposition.names_seen
    )
    return MetricSchema.V1_LEGACY if v1_signs else MetricSchema.V0


def _engine_keys(exposition: Exposition) -> set[EngineKey]:
    keys: set[EngineKey] = set()
    for name in _ENGINE_SCOPED:
        for sample in exposition.get(name):
            keys.add(_key(sample))
    return keys


def _key(sample: Sample) -> EngineKey:
    model_name = engine = None  # one pass over the labels for both (Sample.label would make two)
    for name, value in sample.labels:
        if name == "model_name" and model_name is None:
            model_name = value
        elif name == "engine" and engine is None:
            engine = value
    return (model_name or "", engine or "0")


def _engine_sort_key(key: EngineKey) -> tuple[str, int, str]:
    model, engine = key
    # isdecimal, not isdigit: "²" is a digit that int() refuses, and the label is whatever vLLM (or not) wrote.
    return (model, int(engine) if engine.isdecimal() else -1, engine)


class _ValuesByEngine:
    """Each sample name's values per engine, in exposition order: one pass over a name's samples, not one per
    engine (with 8 engines, reading them one by one went over each sample 8 times)."""

    def __init__(self, exposition: Exposition) -> None:
        self._exposition = exposition
        self._by_name: dict[str, dict[EngineKey, list[float]]] = {}
        self._by_reason: dict[str, dict[tuple[str, str, str], list[float]]] = {}

    def of(self, name: str, key: EngineKey) -> list[float]:
        table = self._by_name.get(name)
        if table is None:
            table = {}
            for sample in self._exposition.get(name):
                table.setdefault(_key(sample), []).append(sample.value)
            self._by_name[name] = table
        return table.get(key, [])

    def of_reason(self, name: str, key: EngineKey, reason: str) -> list[float]:
        """The values of `name` for this engine whose `reason` label is `reason`."""
        table = self._by_reason.get(name)
        if table is None:
            table = {}
            for sample in self._exposition.get(name):
                table.setdefault((*_key(sample), sample.label("reason") or ""), []).append(sample.value)
            self._by_reason[name] = table
        return table.get((*key, reason), [])


def _read_engine(
    values_of: _ValuesByEngine,
    key: EngineKey,
    cache_configs: dict[str | None, CacheConfig],
    healthy: dict[str, bool],
) -> EngineMetrics:
    def first_found(names: tuple[str, ...]) -> list[float]:
        """This engine's values under the first candidate name that has any; NaN means vLLM does not know, and
        an infinity is no measurement either (it would pause on "usage +Inf" and break JSON on /status)."""
        for name in names:
            values = values_of.of(name, key)
            if values:
                return [value for value in values if math.isfinite(value)]
        return []

    def gauge(*names: str) -> float | None:
        # Several series per engine only happen for gauges with a `pid` label (0.9.2-0.11 with
        # --api-server-count > 1), one per API-server process; the highest is the safe reading.
        values = first_found(names)
        return max(values) if values else None

    def counter(*names: str) -> float | None:
        # Counters are summed over processes by vLLM already; several series are label splits to add up.
        values = first_found(names)
        return sum(values) if values else None

    def waiting(reason: str) -> float | None:
        # Like any gauge: the highest of several series (one per API-server process, see `gauge`).
        values = [value for value in values_of.of_reason(WAITING_BY_REASON, key, reason) if math.isfinite(value)]
        return max(values) if values else None

    current_prefix = counter(PREFIX_QUERIES) is not None
    queries_name, hits_name = (PREFIX_QUERIES, PREFIX_HITS) if current_prefix else (PREFIX_QUERIES_OLD, PREFIX_HITS_OLD)
    return EngineMetrics(
        model_name=key[0],
        engine=key[1],
        kv_cache_usage_ratio=gauge(KV_USAGE, KV_USAGE_OLD),
        requests_running=gauge(RUNNING),
        requests_waiting=gauge(WAITING),
        requests_swapped=gauge(SWAPPED),
        cache_config=cache_configs.get(key[1], cache_configs.get(None)),
        prefix_cache_queries_total=counter(queries_name),
        prefix_cache_hits_total=counter(hits_name),
        prefix_cache_hit_rate_gauge=gauge(PREFIX_HIT_RATE_V0),
        preemptions_total=counter(PREEMPTIONS),
        prompt_tokens_total=counter(PROMPT_TOKENS),
        generation_tokens_total=counter(GENERATION_TOKENS),
        iterations_total=counter(ITERATIONS),
        requests_waiting_capacity=waiting(WAITING_CAPACITY),
        requests_waiting_deferred=waiting(WAITING_DEFERRED),
        engine_healthy=healthy.get(key[1]),
    )


def _engine_health(samples: Iterable[Sample], engines: set[str], problems: list[str]) -> dict[str, bool]:
    """vllm:engine_healthy per engine label (it has no model_name: it applies to that engine of every model).

    vLLM writes 1 (healthy) or 0 (unhealthy or dead); several series for one engine (not seen in vLLM) count as
    unhealthy when any says so. A series for an engine that exports nothing else cannot be tied to a model: it is
    reported, not judged.
    """
    health: dict[str, bool] = {}
    for sample in samples:
        if not math.isfinite(sample.value):
            continue
        engine = sample.label("engine") or "0"
        health[engine] = health.get(engine, True) and sample.value > 0
    problems.extend(
        f"{ENGINE_HEALTHY} reports engine {engine!r}, which exports no other vLLM metric here: not judged"
        for engine in sorted(set(health) - engines)
    )
    return health


def _read_models(samples: Iterable[Sample]) -> tuple[ModelMetrics, ...]:
    """vllm:admission_rejections_total per model_name: the sum over reasons and each reason's count."""
    by_model: dict[str, dict[str, float]] = {}
    for sample in samples:
        reasons = by_model.setdefault(sample.label("model_name") or "", {})
        if math.isfinite(sample.value):
            reason = sample.label("reason") or ""
            reasons[reason] = reasons.get(reason, 0.0) + sample.value  # label splits add up, as counters do
    return tuple(
        ModelMetrics(
            model_name=model,
            admission_rejections_total=sum(reasons.values()) if reasons else None,
            admission_rejections_by_reason=tuple(sorted(reasons.items())),
        )
        for model, reasons in sorted(by_model.items())
    )


def _read_cache_configs(samples: Iterable[Sample], problems: list[str]) -> dict[str | None, CacheConfig]:
    """Map engine label (None: applies to every engine, as before 0.9.0) to its cache configuration."""
    # Some forty labels a series: looked up once into a dict, not one scan of them per label read.
    series = [_first_values(sample) for sample in samples]
    engines_in_server = max(1, len({labels["engine"] for labels in series if "engine" in labels}))
    configs: dict[str | None, CacheConfig] = {}
    for labels in series:
        configs[labels.get("engine")] = CacheConfig(
            num_gpu_blocks_server=_int_label(labels, "num_gpu_blocks", problems),
            engines_in_server=engines_in_server,
            block_size_tokens=_int_label(labels, "block_size", problems),
            gpu_memory_utilization=_float_label(labels, "gpu_memory_utilization", problems),
            enable_prefix_caching=_bool_label(labels, "enable_prefix_caching"),
            kv_cache_size_tokens=_int_label(labels, "kv_cache_size_tokens", problems),
        )
    return configs


def _first_values(sample: Sample) -> dict[str, str]:
    """The labels by name; a name written twice keeps its first value, as `Sample.label` reads it."""
    labels: dict[str, str] = {}
    for name, value in sample.labels:
        labels.setdefault(name, value)
    return labels


def _int_label(labels: dict[str, str], key: str, problems: list[str]) -> int | None:
    value = _float_label(labels, key, problems)
    if value is not None and abs(value) > MAX_LABEL_INT:
        # No cache has 2**53 blocks or tokens; as an int it would make products (capacity x block size) no
        # float holds, and prometheus_client's export of them raised OverflowError on /metrics, every tick.
        problems.append(f"{CACHE_CONFIG} label {key}={labels[key]!r} is too large to be a size; ignored")
        return None
    return None if value is None else int(value)


def _float_label(labels: dict[str, str], key: str, problems: list[str]) -> float | None:
    raw = labels.get(key)
    if raw is None or raw == "None":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    # "inf" and "nan" parse as floats but are no sizes: int() of them raised out of the source, every tick.
    if not math.isfinite(value):
        problems.append(f"{CACHE_CONFIG} label {key}={raw!r} is not a number; ignored")
        return None
    return value


def _bool_label(labels: dict[str, str], key: str) -> bool | None:
    raw = labels.get(key)
    return {"True": True, "False": False}.get(raw) if raw is not None else None
