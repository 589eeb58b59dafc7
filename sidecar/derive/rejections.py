"""vLLM's own admission rejections per served model: its rate over the short horizon and its count over the
window. Pure: the caller numbers the snapshots and says where the window and the short horizon begin.

vLLM 0.32+ refuses a request with HTTP 503 when it would exceed `--max-num-queued-reqs` or
`--max-num-queued-tokens` and counts it in `vllm:admission_rejections_total{model_name,reason}` (server level, no
engine label). Before 0.32 there is no such counter, and every value here is None.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from sidecar.derive.running import CounterSteps
from sidecar.model.derived import ModelDerived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import ModelMetrics


class _ModelTrack:
    def __init__(self) -> None:
        self.latest: ModelMetrics | None = None
        self.latest_number = -1
        self.rejections = CounterSteps()

    def add(self, number: int, time_s: float, model: ModelMetrics) -> None:
        self.latest, self.latest_number = model, number
        if model.admission_rejections_total is not None:
            self.rejections.add(number, time_s, model.admission_rejections_total)


class RejectionHistory:
    """Each model's rejection counter over the window, kept a snapshot at a time (as EngineHistory keeps the
    engines' counters): `derive` gives the counter's increase over the window and its rate over the short horizon
    (the tests hold it to the scan it replaces: tests/unit/derive_oracles.py)."""

    def __init__(self) -> None:
        self._models: dict[str, _ModelTrack] = {}

    def reset(self) -> None:
        self._models.clear()

    def add(self, snapshot: Snapshot, number: int) -> None:
        reading = snapshot.vllm.value
        if reading is None or snapshot.vllm.error is not None:
            return
        for model in reading.models:
            track = self._models.get(model.model_name)
            if track is None:
                track = self._models[model.model_name] = _ModelTrack()
            track.add(number, snapshot.monotonic_s, model)

    def derive(
        self, current: Iterable[ModelMetrics], start_s: float, oldest: int, recent: int
    ) -> tuple[ModelDerived, ...]:
        """The models of the latest reading (`current`), with their counters' increase from `start_s` (among the
        snapshots numbered `oldest` and later) and their rate over the snapshots numbered `recent` and later."""
        for name, kept in list(self._models.items()):
            kept.rejections.drop_before(oldest)
            if kept.latest_number < oldest:
                del self._models[name]  # not read within the window: gone from vLLM
        derived: list[ModelDerived] = []
        for model in current:
            track = self._models.get(model.model_name)
            steps = track.rejections if track is not None else CounterSteps()
            first = bisect_left(steps.times, start_s)
            in_window = per_s = None
            if len(steps) - first >= 2:
                in_window = steps.increase_from(first)
                short = max(first, steps.first_at(recent))
                if len(steps) - short >= 2 and steps.times[-1] > steps.times[short]:
                    per_s = steps.increase_from(short) / (steps.times[-1] - steps.times[short])
            derived.append(
                ModelDerived(
                    model_name=model.model_name,
                    admission_rejections_total=model.admission_rejections_total,
                    admission_rejections_by_reason=model.admission_rejections_by_reason,
                    admission_rejections_per_second=per_s,
                    admission_rejections_in_window=in_window,
                )
            )
        return tuple(derived)
