"""Per-engine derived values: KV arithmetic now, prefix-cache hit ratio and preemption rate over the window.

Pure: the window and `now_s` come from the caller.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from sidecar.derive.counter import increase
from sidecar.derive.kv import derive_kv
from sidecar.derive.progress import EngineProgress
from sidecar.derive.running import CounterSteps
from sidecar.model.derived import EngineDerived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics

EngineKey = tuple[str, str]


def derive_engine(
    engine: EngineMetrics, windowed: tuple[float | None, float | None], progress: EngineProgress | None
) -> EngineDerived:
    """`windowed` is (`windowed_hit_ratio`, `preemption_rate`) of this engine's readings in the window, oldest
    first, ending with `engine` itself (EngineHistory.windowed keeps them)."""
    hit_ratio, preemptions_per_s = windowed
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
        prefix_cache_hit_ratio=hit_ratio,
        prefix_cache_hit_ratio_lifetime=lifetime_hit_ratio(engine),
        preemptions_per_second=preemptions_per_s,
        engine_stalled_seconds=None if progress is None else progress.stalled_s,
        seconds_since_progress=None if progress is None else progress.quiet_s,
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


class _Track:
    """One engine's readings in push order, and its counters as running increases (sidecar.derive.running)."""

    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.times: list[float] = []
        self.entries: list[tuple[float, EngineMetrics]] = []
        self.queries = CounterSteps()  # readings with both prefix-cache counters, as windowed_hit_ratio takes
        self.hits = CounterSteps()
        self.preemptions = CounterSteps()

    def add(self, number: int, time_s: float, engine: EngineMetrics) -> None:
        self.numbers.append(number)
        self.times.append(time_s)
        self.entries.append((time_s, engine))
        queries, hits = engine.prefix_cache_queries_total, engine.prefix_cache_hits_total
        if queries is not None and hits is not None:
            self.queries.add(number, time_s, queries)
            self.hits.add(number, time_s, hits)
        if engine.preemptions_total is not None:
            self.preemptions.add(number, time_s, engine.preemptions_total)

    def drop_before(self, oldest: int) -> None:
        gone = bisect_left(self.numbers, oldest)
        if gone:
            del self.numbers[:gone], self.times[:gone], self.entries[:gone]
            for counter in (self.queries, self.hits, self.preemptions):
                counter.drop_before(oldest)


class EngineHistory:
    """What `engine_history(window.since(start_s))` holds, kept up to date one snapshot at a time, and the two
    windowed values derived from it (`windowed_hit_ratio`, `preemption_rate`) without walking it.

    Rebuilding the history scanned the whole window every tick (300 snapshots x every engine at a 1 s
    interval), and the windowed values walked it again; this appends each new snapshot's engines once, cuts
    at `start_s` with a bisection, and keeps the counters' increases as running sums where that is exact.
    """

    def __init__(self) -> None:
        self._engines: dict[EngineKey, _Track] = {}

    def reset(self) -> None:
        self._engines.clear()

    def add(self, snapshot: Snapshot, number: int) -> None:
        reading = snapshot.vllm.value
        if reading is None or snapshot.vllm.error is not None:
            return
        for engine in reading.engines:
            key = (engine.model_name, engine.engine)
            track = self._engines.get(key)
            if track is None:
                track = self._engines[key] = _Track()
            track.add(number, snapshot.monotonic_s, engine)

    def _in_window(self, oldest: int) -> list[tuple[EngineKey, _Track]]:
        for key, track in list(self._engines.items()):
            track.drop_before(oldest)  # no longer in the window
            if not track.numbers:
                del self._engines[key]
        return list(self._engines.items())

    def since(self, start_s: float, oldest: int) -> dict[EngineKey, list[tuple[float, EngineMetrics]]]:
        """Every engine's entries at or after `start_s` among the snapshots numbered `oldest` and later."""
        history: dict[EngineKey, list[tuple[float, EngineMetrics]]] = {}
        for key, track in self._in_window(oldest):
            first = bisect_left(track.times, start_s)
            if first < len(track.entries):
                history[key] = track.entries[first:]
        return history

    def windowed(self, start_s: float, oldest: int) -> dict[EngineKey, tuple[float | None, float | None]]:
        """Per engine with entries in the window, `windowed_hit_ratio` and `preemption_rate` of them."""
        values: dict[EngineKey, tuple[float | None, float | None]] = {}
        for key, track in self._in_window(oldest):
            first = bisect_left(track.times, start_s)
            if first == len(track.entries):
                continue
            position = track.numbers[first]
            values[key] = (_hit_ratio(track, position), _preemption_rate(track.preemptions, position))
        return values


def _hit_ratio(track: _Track, position: int) -> float | None:
    """`windowed_hit_ratio` of the track's entries from `position` on."""
    first = track.queries.first_at(position)
    if first < len(track.queries):
        queries = track.queries.increase_from(first)
        hits = track.hits.increase_from(first)
        return _clamp_ratio(hits / queries) if queries > 0 else None
    gauge = track.entries[-1][1].prefix_cache_hit_rate_gauge
    return _clamp_ratio(gauge) if gauge is not None and gauge >= 0 else None


def _preemption_rate(preemptions: CounterSteps, position: int) -> float | None:
    """`preemption_rate` of the readings from `position` on."""
    first = preemptions.first_at(position)
    if len(preemptions) - first < 2 or preemptions.times[-1] <= preemptions.times[first]:
        return None
    return preemptions.increase_from(first) / (preemptions.times[-1] - preemptions.times[first])


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
