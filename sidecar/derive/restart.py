"""Where the current vLLM process's history starts in the window. Pure.

A trend fitted across a restart mixes two processes: the memory a crashed vLLM held, then a fresh one's.
So trends start after the last sign of a restart: a poll that could not read vLLM, or a counter of any
engine that went backwards (Prometheus' own reset rule).
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics


def _counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (engine.prompt_tokens_total, engine.generation_tokens_total, engine.iterations_total)


def last_restart_s(snapshots: Iterable[Snapshot]) -> float | None:
    """Time of the first snapshot of the current vLLM process, or None when the window shows no restart."""
    restart: float | None = None
    previous: dict[tuple[str, str], tuple[float | None, ...]] = {}
    after_failure = False
    for snapshot in snapshots:
        reading = snapshot.vllm.value if snapshot.vllm.error is None else None
        if reading is None:
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
