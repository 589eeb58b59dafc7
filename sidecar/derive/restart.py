"""Where the current vLLM process's history starts in the window. Pure.

A trend fitted across a restart mixes two processes: the memory a crashed vLLM held, then a fresh one's.
So trends start after the last sign of a restart: a poll that found vLLM gone, or a counter of any engine that
went backwards (Prometheus' own reset rule).

A poll found vLLM gone when nothing listened (connection refused) or /health answered other than 200 in that
tick. A /metrics read that timed out or failed while /health answered, or gave no answer in time either, is the
same process answering slowly, which is when a loaded vLLM's memory matters most: it is no sign, so it does not
throw away the trend (and delay the OOM forecast by the trend's minimum span). A restart it hides still shows:
vLLM takes tens of seconds to start, so the polls in between find nothing listening, and a new process's
counters start again from zero.
"""

from __future__ import annotations

from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics


def _counters(engine: EngineMetrics) -> tuple[float | None, ...]:
    return (engine.prompt_tokens_total, engine.generation_tokens_total, engine.iterations_total)


def found_vllm_gone(snapshot: Snapshot) -> bool:
    """Whether a poll that could not read /metrics found vLLM gone: nothing listening, or /health answered other
    than 200. A /health that gave no answer in time is the same process slow, as a /metrics read that timed out."""
    return snapshot.vllm.unreachable or (snapshot.vllm_healthy is not True and not snapshot.vllm_slow)


class RestartTracker:
    """Time of the first snapshot of the current vLLM process since `start_s` (None when the range shows no
    restart), from a mark set once per snapshot (the tests hold it to the scan it replaces:
    tests/unit/derive_oracles.py).

    Whether a snapshot is a sign of a restart depends only on the snapshot before it (a poll that found vLLM
    gone, or a counter above this one's; a poll that failed with vLLM still there is passed over), and a range's
    first snapshot has no sign since the scan starts there. So the answer is the newest sign, if the snapshot
    before it is in the range too; the scan is not needed.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._before: dict[tuple[str, str], tuple[float | None, ...]] | None = None  # None: nothing before
        self._before_failed = False
        self._before_number, self._before_s = 0, 0.0
        # time of the sign, and number and time of the snapshot it was compared with
        self._sign: tuple[float, int, float] | None = None

    def add(self, snapshot: Snapshot, number: int) -> None:
        reading = snapshot.vllm.value if snapshot.vllm.error is None else None
        previous = self._before
        if reading is None:
            if found_vllm_gone(snapshot):
                self._before, self._before_failed = {}, True
                self._before_number, self._before_s = number, snapshot.monotonic_s
            return
        current = {(engine.model_name, engine.engine): _counters(engine) for engine in reading.engines}
        if previous is not None:
            went_back = any(
                now is not None and before is not None and now < before
                for key, values in current.items()
                for now, before in zip(values, previous.get(key, ()), strict=False)
            )
            if self._before_failed or went_back:
                self._sign = (snapshot.monotonic_s, self._before_number, self._before_s)
        self._before, self._before_failed = current, False
        self._before_number, self._before_s = number, snapshot.monotonic_s

    def last_restart_s(self, start_s: float, oldest: int) -> float | None:
        """For the snapshots at or after `start_s` among those numbered `oldest` and later."""
        if self._sign is None:
            return None
        sign_s, before_number, before_s = self._sign
        return sign_s if before_number >= oldest and before_s >= start_s else None
