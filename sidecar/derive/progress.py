"""Engine progress: how long an engine with running requests has gone without moving its counters. Pure.

vLLM's /health only says the engine task is alive; a hung EngineCore keeps answering 200 with frozen
/metrics. Progress is judged from what a working engine cannot help moving: token and step counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model.vllm import EngineMetrics


@dataclass(frozen=True, slots=True)
class _Progress:
    counters: tuple[float | None, ...]
    progressed_at_s: float


class ProgressTracker:
    """Remembers, per engine, the counters and when they last moved (or the engine was idle)."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, str], _Progress] = {}

    def observe(self, engines: tuple[EngineMetrics, ...], now_s: float) -> dict[tuple[str, str], float | None]:
        """Record this scrape; return seconds stalled per engine (None when no counter is exported)."""
        stalled: dict[tuple[str, str], float | None] = {}
        current: dict[tuple[str, str], _Progress] = {}
        for engine in engines:
            key = (engine.model_name, engine.engine)
            counters = (engine.generation_tokens_total, engine.prompt_tokens_total, engine.iterations_total)
            previous = self._state.get(key)
            if all(value is None for value in counters):
                stalled[key] = None
                continue
            idle = not engine.requests_running
            moved = previous is None or counters != previous.counters
            if idle or moved or previous is None:
                current[key] = _Progress(counters, now_s)
                stalled[key] = 0.0
            else:
                current[key] = _Progress(counters, previous.progressed_at_s)
                stalled[key] = now_s - previous.progressed_at_s
        self._state = current
        return stalled
