"""Engine progress: how long an engine has gone without moving its counters, with and without work. Pure.

vLLM's /health only says the engine task is alive; a hung EngineCore keeps answering 200 with frozen
/metrics. Progress is judged from what a working engine cannot help moving: token and step counters.

Two durations per engine:
- stalled: no progress while there was work (requests running or waiting, or in flight at the API server by
  vLLM's /load), counted from when the work appeared if the engine was idle before; 0 without work. A wedged
  scheduler that admits nothing shows as waiting with 0 running, so waiting counts as work too.
- quiet: no progress at all, work or not. An engine wedged while idle freezes its metrics at 0 running and 0
  waiting, and requests sent to it hang where /metrics cannot see them; only an active probe tells, and the
  policy sends one after the engine has been quiet for a while.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model.vllm import EngineMetrics


@dataclass(frozen=True, slots=True)
class EngineProgress:
    stalled_s: float  # 0 when there is no work, or the counters just moved
    quiet_s: float  # since the counters last moved (or were first seen)


@dataclass(frozen=True, slots=True)
class _Progress:
    counters: tuple[float | None, ...]
    moved_s: float  # the counters last moved (or were first seen)
    work_since_s: float | None  # work present without a break since; None while idle


class ProgressTracker:
    """Remembers, per engine, the counters, when they last moved and since when there has been work."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, str], _Progress] = {}

    def observe(
        self, engines: tuple[EngineMetrics, ...], now_s: float, in_flight: int | None = None
    ) -> dict[tuple[str, str], EngineProgress | None]:
        """Record this scrape; per engine its progress (None when no counter is exported). `in_flight` is the
        server's in-flight request count from /load, when known: work the engine's own gauges may not show."""
        progress: dict[tuple[str, str], EngineProgress | None] = {}
        current: dict[tuple[str, str], _Progress] = {}
        for engine in engines:
            key = (engine.model_name, engine.engine)
            counters = (engine.generation_tokens_total, engine.prompt_tokens_total, engine.iterations_total)
            if all(value is None for value in counters):
                progress[key] = None
                continue
            previous = self._state.get(key)
            work = bool(engine.requests_running) or bool(engine.requests_waiting) or bool(in_flight)
            if previous is None or counters != previous.counters:
                moved_s, work_since_s = now_s, (now_s if work else None)
            else:
                moved_s = previous.moved_s
                work_since_s = (previous.work_since_s if previous.work_since_s is not None else now_s) if work else None
            current[key] = _Progress(counters, moved_s, work_since_s)
            stalled = 0.0 if work_since_s is None else now_s - max(moved_s, work_since_s)
            progress[key] = EngineProgress(stalled_s=stalled, quiet_s=now_s - moved_s)
        self._state = current
        return progress
