"""Per-engine derived values: KV arithmetic now, prefix-cache hit ratio and preemption rate over the window.

Pure: the window and `now_s` come from the caller.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from sidecar.derive.counter import increase
from sidecar.derive.kv import derive_kv
from sidecar.model.derived import EngineDerived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics

EngineKey = tuple[str, str]


def derive_engine(
    engine: EngineMetrics, history: list[tuple[float, EngineMetrics]], stalled_s: float | None
) -> EngineDerived:
    """`history` holds this engine's readings in the window, oldest first, ending with `engine` itself."""
    kv = derive_kv(engine)
    return EngineDerived(
        model_name=engine.model_name,
        engine=engine.engine,
        requests_running=engine.requests_running,
        requests_waiting=engine.requests_waiting,
        kv_cache_usage_ratio=engine.kv_cache_usage_ratio,
        kv_cache_capacity_blocks=kv.capacity_blocks,
        kv_cache_block_size_tokens=kv.block_size_tokens,
        kv_cache_used_blocks=kv.used_blocks,
        kv_cache_blocks_per_request=kv.blocks_per_request,
        kv_cache_request_headroom=kv.request_headroom,
        kv_cache_fragmentation_ratio=kv.fragmentation_ratio,
        prefix_cache_hit_ratio=windowed_hit_ratio(history),
        prefix_cache_hit_ratio_lifetime=lifetime_hit_ratio(engine),
        preemptions_per_second=preemption_rate(history),
        engine_stalled_seconds=stalled_s,
    )


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


class EngineHistory:
    """What `engine_history(window.since(start_s))` returns, kept up to date one snapshot at a time.

    Rebuilding it scanned the whole window every tick (300 snapshots x every engine at a 1 s interval); this
    appends each new snapshot's engines once and cuts each engine's list at `start_s` with a bisection.
    """

    def __init__(self) -> None:
        # Per engine: the snapshot numbers, their times, and the (time, metrics) entries, all in push order.
        self._engines: dict[EngineKey, tuple[list[int], list[float], list[tuple[float, EngineMetrics]]]] = {}

    def reset(self) -> None:
        self._engines.clear()

    def add(self, snapshot: Snapshot, number: int) -> None:
        reading = snapshot.vllm.value
        if reading is None or snapshot.vllm.error is not None:
            return
        for engine in reading.engines:
            numbers, times, entries = self._engines.setdefault((engine.model_name, engine.engine), ([], [], []))
            numbers.append(number)
            times.append(snapshot.monotonic_s)
            entries.append((snapshot.monotonic_s, engine))

    def since(self, start_s: float, oldest: int) -> dict[EngineKey, list[tuple[float, EngineMetrics]]]:
        """Every engine's entries at or after `start_s` among the snapshots numbered `oldest` and later."""
        history: dict[EngineKey, list[tuple[float, EngineMetrics]]] = {}
        for key, (numbers, times, entries) in list(self._engines.items()):
            gone = bisect_left(numbers, oldest)  # no longer in the window
            if gone:
                del numbers[:gone], times[:gone], entries[:gone]
            if not numbers:
                del self._engines[key]
                continue
            first = bisect_left(times, start_s)
            if first < len(entries):
                history[key] = entries[first:]
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


def lifetime_hit_ratio(engine: EngineMetrics) -> float | None:
    queries, hits = engine.prefix_cache_queries_total, engine.prefix_cache_hits_total
    if queries is not None and hits is not None:
        return _clamp_ratio(hits / queries) if queries > 0 else None
    gauge = engine.prefix_cache_hit_rate_gauge
    return _clamp_ratio(gauge) if gauge is not None and gauge >= 0 else None


def preemption_rate(history: list[tuple[float, EngineMetrics]]) -> float | None:
    points = [(t, engine.preemptions_total) for t, engine in history if engine.preemptions_total is not None]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return increase([value for _, value in points if value is not None]) / (points[-1][0] - points[0][0])


def _clamp_ratio(value: float) -> float:
    return min(1.0, max(0.0, value))
