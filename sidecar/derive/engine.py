"""Per-engine derived values: KV arithmetic now; prefix-cache hit ratio and preemptions over the window; the
preemption rate over the short horizon (the last few polls); how long vLLM has reported the engine unhealthy.

Pure: the window, its positions and `now_s` come from the caller.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from sidecar.derive.kv import NullBlock, derive_kv
from sidecar.derive.progress import EngineProgress
from sidecar.derive.running import CounterSteps
from sidecar.model.derived import EngineDerived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics

EngineKey = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineWindow:
    """What one engine's readings in the window say beyond its latest one."""

    hit_ratio: float | None  # Δhits / Δqueries over the window (the V0 gauge where there are no counters)
    preemptions_per_s: float | None  # preemptions per second over the short horizon
    preemptions_in_window: float | None  # preemptions counted over the window (through resets)
    unhealthy_s: float | None = None  # since vLLM first reported it unhealthy (in a row); 0 healthy; None unknown


def derive_engine(
    engine: EngineMetrics,
    window: EngineWindow,
    progress: EngineProgress | None,
    *,
    null_block: NullBlock = NullBlock.EXCLUDED,
) -> EngineDerived:
    """`window` is what EngineHistory.windowed says of this engine's readings, which end with `engine` itself;
    `null_block` how its vLLM counts the null block (`sidecar.derive.kv.null_block_of`)."""
    kv = derive_kv(engine, null_block=null_block)
    waiting, deferred = engine.requests_waiting, engine.requests_waiting_deferred
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
        prefix_cache_hit_ratio=window.hit_ratio,
        prefix_cache_hit_ratio_lifetime=lifetime_hit_ratio(engine),
        preemptions_per_second=window.preemptions_per_s,
        engine_stalled_seconds=None if progress is None else progress.stalled_s,
        seconds_since_progress=None if progress is None else progress.quiet_s,
        requests_waiting_capacity=engine.requests_waiting_capacity,
        requests_waiting_deferred=deferred,
        requests_waiting_deferred_ratio=_clamp_ratio(deferred / waiting) if deferred is not None and waiting else None,
        engine_healthy=engine.engine_healthy,
        engine_unhealthy_seconds=window.unhealthy_s,
        preemptions_in_window=window.preemptions_in_window,
        kv_cache_capacity_tokens=kv.capacity_tokens,
        kv_cache_free_blocks=kv.free_blocks,
        generation_tokens_total=engine.generation_tokens_total,
    )


class _Track:
    """One engine's readings in push order, and its counters as running increases (sidecar.derive.running)."""

    def __init__(self) -> None:
        self.numbers: list[int] = []
        self.times: list[float] = []
        self.entries: list[tuple[float, EngineMetrics]] = []
        self.queries = CounterSteps()  # readings with both prefix-cache counters
        self.hits = CounterSteps()
        self.preemptions = CounterSteps()
        self.unhealthy_since_s: float | None = None  # first of the latest readings in a row with engine_healthy 0

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
        # Not bound to the window: an engine unhealthy for longer than the window has been so all along. A reading
        # without the metric (fault tolerance turned off) or saying healthy ends the run.
        if engine.engine_healthy is False:
            if self.unhealthy_since_s is None:
                self.unhealthy_since_s = time_s
        else:
            self.unhealthy_since_s = None

    def drop_before(self, oldest: int) -> None:
        gone = bisect_left(self.numbers, oldest)
        if gone:
            del self.numbers[:gone], self.times[:gone], self.entries[:gone]
            for counter in (self.queries, self.hits, self.preemptions):
                counter.drop_before(oldest)


class EngineHistory:
    """Every successful reading of every engine since `start_s`, keyed by (model_name, engine), kept up to date
    one snapshot at a time, and the values derived from it (the hit ratio and the preemptions over the window,
    the preemption rate over the short horizon) without walking it. Its oracles, the same values computed from
    the window's snapshots, are the tests' (tests/unit/derive_oracles.py).

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

    def windowed(self, start_s: float, oldest: int, recent: int | None = None) -> dict[EngineKey, EngineWindow]:
        """Per engine with entries in the window (from `start_s`, among the snapshots numbered `oldest` and later):
        its `EngineWindow`. The short horizon is the entries of the snapshots numbered `recent` and later (None:
        the whole window)."""
        values: dict[EngineKey, EngineWindow] = {}
        for key, track in self._in_window(oldest):
            first = bisect_left(track.times, start_s)
            if first == len(track.entries):
                continue
            position = track.numbers[first]
            short = position if recent is None else max(position, recent)
            since = track.unhealthy_since_s
            latest_s, latest = track.entries[-1]
            unhealthy = None if latest.engine_healthy is None else latest_s - (latest_s if since is None else since)
            values[key] = EngineWindow(
                hit_ratio=_hit_ratio(track, position),
                preemptions_per_s=_rate(track.preemptions, short),
                preemptions_in_window=_increase(track.preemptions, position),
                unhealthy_s=unhealthy,
            )
        return values


def _hit_ratio(track: _Track, position: int) -> float | None:
    """Δhits / Δqueries over the track's entries from `position` on; None when no query happened (0/0 is not
    0 %). V0 exports only its own hit-rate gauge (-1: prefix caching off), read from the latest entry."""
    first = track.queries.first_at(position)
    if first < len(track.queries):
        queries = track.queries.increase_from(first)
        hits = track.hits.increase_from(first)
        return _clamp_ratio(hits / queries) if queries > 0 else None
    gauge = track.entries[-1][1].prefix_cache_hit_rate_gauge
    return _clamp_ratio(gauge) if gauge is not None and gauge >= 0 else None


def _rate(counter: CounterSteps, position: int) -> float | None:
    """The counter's increase per second (through resets) over the readings from `position` on; None with
    fewer than two readings or no time between them."""
    first = counter.first_at(position)
    if len(counter) - first < 2 or counter.times[-1] <= counter.times[first]:
        return None
    return counter.increase_from(first) / (counter.times[-1] - counter.times[first])


def _increase(counter: CounterSteps, position: int) -> float | None:
    """The counter's increase (through resets) over the readings from `position` on; None with fewer than two
    readings: one reading has no increase to tell."""
    first = counter.first_at(position)
    return counter.increase_from(first) if len(counter) - first >= 2 else None


def lifetime_hit_ratio(engine: EngineMetrics) -> float | None:
    queries, hits = engine.prefix_cache_queries_total, engine.prefix_cache_hits_total
    if queries is not None and hits is not None:
        return _clamp_ratio(hits / queries) if queries > 0 else None
    gauge = engine.prefix_cache_hit_rate_gauge
    return _clamp_ratio(gauge) if gauge is not None and gauge >= 0 else None


def _clamp_ratio(value: float) -> float:
    return min(1.0, max(0.0, value))
