"""The derive trackers' oracles: each value the Deriver keeps up to date one snapshot at a time, computed the
slow and obvious way from the window's snapshots. Test code only (moved out of sidecar/derive, which keeps the
trackers alone); tests/unit/test_derive_trackers.py holds the trackers to them, tests/unit/test_derive.py pins
what they mean. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.derive.counter import increase
from sidecar.derive.engine import EngineKey
from sidecar.derive.gpu import REGIME_DROP_RATIO
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics, ModelMetrics


def engine_history(snapshots: Iterable[Snapshot]) -> dict[EngineKey, list[tuple[float, EngineMetrics]]]:
    """Every successful reading of every engine in `snapshots`, keyed by (model_name, engine)."""
    history: dict[EngineKey, list[tuple[float, EngineMetrics]]] = {}
    for snapshot in snapshots:
        reading = snapshot.vllm.value
        if reading is None or snapshot.vllm.error is not None:
            continue
        for engine in reading.engines:
            history.setdefault((engine.model_name, engine.engine), []).append((snapshot.monotonic_s, engine))
    return history


def windowed_hit_ratio(history: list[tuple[float, EngineMetrics]]) -> float | None:
    """Δhits / Δqueries over the window; None when no query happened (0/0 is not 0 %)."""
    latest = history[-1][1]
    pairs = [
        (engine.prefix_cache_queries_total, engine.prefix_cache_hits_total)
        for _, engine in history
        if engine.prefix_cache_queries_total is not None and engine.prefix_cache_hits_total is not None
    ]
    if pairs:
        queries = increase([q for q, _ in pairs])
        hits = increase([h for _, h in pairs])
        return _clamp_ratio(hits / queries) if queries > 0 else None
    # V0 exports only its own hit-rate gauge; -1 means prefix caching is off.
    gauge = latest.prefix_cache_hit_rate_gauge
    return _clamp_ratio(gauge) if gauge is not None and gauge >= 0 else None


def preemption_rate(history: list[tuple[float, EngineMetrics]]) -> float | None:
    points = [(t, engine.preemptions_total) for t, engine in history if engine.preemptions_total is not None]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return increase([value for _, value in points if value is not None]) / (points[-1][0] - points[0][0])


def preemptions_in(history: list[tuple[float, EngineMetrics]]) -> float | None:
    """Preemptions counted over `history` (through resets); None with fewer than two readings: one reading has
    no increase to tell."""
    values = [engine.preemptions_total for _, engine in history if engine.preemptions_total is not None]
    return increase([value for value in values if value is not None]) if len(values) >= 2 else None


def memory_history(snapshots: Iterable[Snapshot]) -> dict[int, list[tuple[float, float]]]:
    """(time, used bytes) per GPU index since its last large drop, from every successful GPU reading."""
    history: dict[int, list[tuple[float, float]]] = {}
    for snapshot in snapshots:
        if snapshot.gpu is None or snapshot.gpu.value is None or snapshot.gpu.error is not None:
            continue
        for device in snapshot.gpu.value.devices:
            points = history.setdefault(device.index, [])
            used = float(device.memory_used_bytes)
            if points and points[-1][1] - used > REGIME_DROP_RATIO * device.memory_total_bytes:
                points.clear()
            points.append((snapshot.monotonic_s, used))
    return history


def last_restart_s(snapshots: Iterable[Snapshot]) -> float | None:
    """Time of the first snapshot of the current vLLM process, or None when the window shows no restart."""
    restart: float | None = None
    previous: dict[tuple[str, str], tuple[float | None, ...]] = {}
    after_failure = False
    for snapshot in snapshots:
        reading = snapshot.vllm.value if snapshot.vllm.error is None else None
        if reading is None:
            if snapshot.vllm.unreachable or snapshot.vllm_healthy is not True:  # vLLM gone, not only slow
                after_failure = True
                previous = {}
            continue
        current = {(engine.model_name, engine.engine): _counters(engine) for engine in reading.engines}
        went_back = any(
            now is not None and before is not None and now < before
            for key, values in current.items()
            for now, before in zip(values, previous.get(key, ()), strict=False)
        )
        if after_failure or went_back:
            restart = snapshot.monotonic_s
        after_failure = False
        previous = current
    return restart


def rejections_over(readings: list[tuple[float, ModelMetrics]]) -> tuple[float | None, float | None]:
    """(increase, increase per second) of one model's rejection counter over `readings`, oldest first: what
    `RejectionHistory` computes; None where fewer than two readings carry the counter."""
    points = [(t, model.admission_rejections_total) for t, model in readings]
    known = [(t, value) for t, value in points if value is not None]
    if len(known) < 2:
        return None, None
    total = increase([value for _, value in known])
    span_s = known[-1][0] - known[0][0]
    return total, total / span_s if span_s > 0 else None


def _clamp_ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def _counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (engine.prompt_tokens_total, engine.generation_tokens_total, engine.iterations_total)
