"""Where the current vLLM process's history starts in the window. Pure.

A trend fitted across a restart mixes two processes: the memory a crashed vLLM held, then a fresh one's.
So trends start after the last sign of a restart: a poll that could not read vLLM, or a counter of any
engine that went backwards (Prometheus' own reset rule).
"""

from __future__ import annotations

from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics


def _counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (engine.prompt_tokens_total, engine.generation_tokens_total, engine.iterations_total)


class RestartTracker:
    """Time of the first snapshot of the current vLLM process since `start_s` (None when the range shows no
    restart), from a mark set once per snapshot (the tests hold it to the scan it replaces:
    tests/unit/derive_oracles.py).

    Whether a snapshot is a sign of a restart depends only on the snapshot before it (a failed poll, or a
    counter above this one's), and a range's first snapshot has no sign since the scan starts there. So the
    answer is the newest sign, if the snapshot before it is in the range too; the scan is not needed.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._before: dict[tuple[str, str], tuple[float | None, ...]] | None = None  # None: nothing before
        self._before_failed = False
        self._before_s = 0.0
        self._sign: tuple[int, float, float] | None = None  # number, time, time of the snapshot before it

    def add(self, snapshot: Snapshot, number: int) -> None:
        reading = snapshot.vllm.value if snapshot.vllm.error is None else None
        previous = self._before
        if reading is None:
            self._before, self._before_failed, self._before_s = {}, True, snapshot.monotonic_s
            return
        current = {(engine.model_name, engine.engine): _counters(engine) for engine in reading.engines}
        if previous is not None:
            went_back = any(
                now is not None and before is not None and now < before
                for key, values in current.items()
                for now, before in zip(values, previous.get(key, ()), strict=False)
            )
            if self._before_failed or went_back:
                self._sign = (number, snapshot.monotonic_s, self._before_s)
        self._before, self._before_failed, self._before_s = current, False, snapshot.monotonic_s

    def last_restart_s(self, start_s: float, oldest: int) -> float | None:
        """For the snapshots at or after `start_s` among those numbered `oldest` and later."""
        if self._sign is None:
            return None
        number, sign_s, before_s = self._sign
        return sign_s if number - 1 >= oldest and before_s >= start_s else None
