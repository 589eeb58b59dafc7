"""The Deriver's incremental histories equal the functions they stand in for, and fit_line its old formula.

The Deriver keeps engine readings, GPU memory points, restart signs and vLLM's rejection counters up to date one
snapshot at a time (sidecar.derive.engine.EngineHistory, gpu.MemoryHistory, restart.RestartTracker,
rejections.RejectionHistory) instead of rescanning the window every tick. Oracle: the functions over
`window.since(start_s)` in tests/unit/derive_oracles.py (engine_history, memory_history, last_restart_s,
rejections_over), and over the last polls of it for the short horizon, on generated sequences with failed polls,
counter resets, memory drops, GPU errors, equal timestamps, windows that forget by age and by count, ticks that
skip a derive, and a window swapped for another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.derive.engine import EngineHistory, EngineWindow
from sidecar.derive.gpu import MemoryHistory
from sidecar.derive.rejections import RejectionHistory
from sidecar.derive.restart import RestartTracker
from sidecar.derive.trend import LineFit, fit_line
from sidecar.derive.window import Follower, Window
from sidecar.model.gpu import GpuReading
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.model.vllm import ModelMetrics
from tests.property.profile import budget
from tests.unit.builders import GIB, device, engine, snapshot
from tests.unit.derive_oracles import (
    engine_history,
    last_restart_s,
    memory_history,
    preemption_rate,
    preemptions_in,
    rejections_over,
    windowed_hit_ratio,
)

ENGINES = (("m", "0"), ("m", "1"), ("n", "0"))


def _gpu_error() -> SourceResult[GpuReading]:
    return SourceResult(source="nvml", duration_s=0.0, error="NVML gone")


# Counter readings as the windowed ratios meet them: whole numbers (the running sums' case), resets, None,
# and what sends them back to adding step by step (fractions, negatives, values past 2**53).
COUNTER_VALUES = st.sampled_from(
    [None, 0.0, 3.0, 100.0, 150.0, 1e6, 1e6 + 7, 0.5, -4.0, 2.0**53, 2.0**60]
) | st.integers(0, 10**6).map(float)


@st.composite
def sequences(draw: st.DrawFn) -> list[Snapshot]:
    t = 1000.0
    counters = dict.fromkeys(ENGINES, 100.0)
    used = {0: 40 * GIB, 1: 50 * GIB}
    out: list[Snapshot] = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 3.0, 7.0]))
        for key in ENGINES:
            counters[key] = draw(st.sampled_from([counters[key], counters[key] + 5, counters[key] + 50, 2.0]))
        for index, before in list(used.items()):
            used[index] = draw(st.sampled_from([before, before + GIB, before - 10 * GIB, 60 * GIB]))
        keys = draw(st.lists(st.sampled_from(ENGINES), min_size=1, max_size=3, unique=True))
        engines = tuple(
            engine(
                model_name=model,
                engine=number,
                prompt_tokens_total=counters[(model, number)],
                generation_tokens_total=draw(st.sampled_from([None, counters[(model, number)]])),
                prefix_cache_queries_total=draw(COUNTER_VALUES),
                prefix_cache_hits_total=draw(COUNTER_VALUES),
                preemptions_total=draw(COUNTER_VALUES),
                prefix_cache_hit_rate_gauge=draw(st.sampled_from([None, -1.0, 0.25])),
            )
            for model, number in keys
        )
        gpu_kind = draw(st.sampled_from(["none", "error", "both", "first"]))
        devices = None if gpu_kind in ("none", "error") else tuple(device(i, used=max(0, used[i])) for i in used)
        if gpu_kind == "first" and devices is not None:
            devices = devices[:1]
        models = tuple(
            ModelMetrics(model_name=model, admission_rejections_total=draw(COUNTER_VALUES))
            for model in draw(st.lists(st.sampled_from(["m", "n"]), max_size=2, unique=True))
        )
        shot = snapshot(
            t,
            engines,
            devices=devices,
            vllm_error="down" if draw(st.booleans()) and draw(st.booleans()) else None,
            unreachable=draw(st.booleans()),
            healthy=draw(st.sampled_from([True, False, None])),
            models=models,
        )
        if gpu_kind == "error":
            shot = Snapshot(
                monotonic_s=shot.monotonic_s,
                wall_time_s=shot.wall_time_s,
                vllm=shot.vllm,
                vllm_healthy=shot.vllm_healthy,
                gpu=_gpu_error(),
            )
        out.append(shot)
    return out


@given(
    shots=sequences(),
    span_s=st.sampled_from([5.0, 20.0, 1000.0]),
    max_snapshots=st.sampled_from([3, 8, 10_000]),
    steps=st.lists(st.sampled_from(["derive", "derive", "derive", "skip", "swap"]), min_size=40, max_size=40),
    backs=st.lists(st.sampled_from([0.0, 1.0, 3.0, 10.0, 1e9]), min_size=1, max_size=4),
    horizon=st.sampled_from([1, 2, 5]),
)
@budget()  # 200 examples: drawing 40 snapshots is most of each one's time (PROPERTY_PROFILE=long soaks)
def test_trackers_equal_the_functions_over_the_window(  # noqa: PLR0917 - hypothesis passes what it draws
    shots: list[Snapshot], span_s: float, max_snapshots: int, steps: list[str], backs: list[float], horizon: int
) -> None:
    window = Window(span_s=span_s, max_snapshots=max_snapshots)
    follower, engines, memory, restarts = Follower(), EngineHistory(), MemoryHistory(), RestartTracker()
    rejections = RejectionHistory()
    for shot, step in zip(shots, steps, strict=False):
        window.push(shot)
        if step == "skip":
            continue  # two pushes before the next derive
        if step == "swap":  # another window with the same snapshots: the trackers must start over
            swapped = Window(span_s=span_s, max_snapshots=max_snapshots)
            for kept in window.since(float("-inf")):
                swapped.push(kept)
            window = swapped
        newer, start_over = follower.advance(window)
        if start_over:
            engines.reset()
            memory.reset()
            restarts.reset()
            rejections.reset()
        for number, kept in enumerate(newer, start=follower.count - len(newer)):
            engines.add(kept, number)
            memory.add(kept, number)
            restarts.add(kept, number)
            rejections.add(kept, number)
        now = shot.monotonic_s
        recent = follower.count - 1 - horizon
        for back in backs:
            start = now - back
            history = engine_history(window.since(start))
            assert engines.since(start, follower.oldest) == history
            # The short horizon: the last `horizon` poll intervals, i.e. the newest horizon + 1 snapshots.
            recent_history = engine_history(list(window.since(start))[-(horizon + 1) :])
            windowed = {
                key: EngineWindow(
                    hit_ratio=windowed_hit_ratio(h),
                    preemptions_per_s=preemption_rate(recent_history.get(key, [])),
                    preemptions_in_window=preemptions_in(h),
                )
                for key, h in history.items()
            }
            # repr: bit for bit, None and NaN included; sorted: the Deriver looks engines up by key.
            got = engines.windowed(start, follower.oldest, recent)
            assert repr(sorted(got.items())) == repr(sorted(windowed.items()))
            if back == backs[0]:  # one window start is enough for the model counters (and keeps the test fast)
                _check_rejections(rejections, window, shot, start=start, oldest=follower.oldest, horizon=horizon)
            assert memory.since(start, follower.oldest) == memory_history(window.since(start))
            assert restarts.last_restart_s(start, follower.oldest) == last_restart_s(window.since(start))


def _check_rejections(
    rejections: RejectionHistory, window: Window, shot: Snapshot, *, start: float, oldest: int, horizon: int
) -> None:
    recent = oldest + len(window) - 1 - horizon  # the number of the first snapshot of the short horizon
    reading = shot.vllm.value if shot.vllm.error is None else None
    if reading is None:
        return  # the Deriver derives nothing of vLLM without a reading
    kept = list(window.since(start))
    by_model: dict[str, list[tuple[int, float, ModelMetrics]]] = {}
    for index, s in enumerate(kept):
        if s.vllm.value is not None and s.vllm.error is None:
            for m in s.vllm.value.models:
                by_model.setdefault(m.model_name, []).append((index, s.monotonic_s, m))
    for model in rejections.derive(reading.models, start, oldest, recent):
        readings = by_model.get(model.model_name, [])
        in_window, _ = rejections_over([(t, m) for _, t, m in readings])
        first_recent = len(kept) - (horizon + 1)
        _, per_s = rejections_over([(t, m) for index, t, m in readings if index >= first_recent])
        assert repr((model.admission_rejections_in_window, model.admission_rejections_per_second)) == repr(
            (in_window, per_s)
        )


def _old_fit_line(points: Sequence[tuple[float, float]]) -> LineFit | None:
    """fit_line as it was written before its loops went to C: the oracle for bit-for-bit equality."""
    count = len(points)
    if count < 2:
        return None
    mean_t = sum(t for t, _ in points) / count
    mean_v = sum(v for _, v in points) / count
    s_tt = sum((t - mean_t) ** 2 for t, _ in points)
    s_tv = sum((t - mean_t) * (v - mean_v) for t, v in points)
    s_vv = sum((v - mean_v) ** 2 for _, v in points)
    if s_tt == 0:
        return None
    slope = s_tv / s_tt
    spread = s_tt * s_vv  # the one change since: this product underflowed to 0 for spreads of 1e-92 and divided
    r2 = (s_tv * s_tv) / spread if spread > 0 else 0.0
    return LineFit(slope_per_s=slope, r2=r2, points=count, span_s=points[-1][0] - points[0][0])


def test_a_spread_too_small_for_its_product_is_no_fit_not_a_division_by_zero() -> None:
    tiny = 5.1730367075945074e-92
    fit = fit_line([(0.0, 0.0), (tiny, tiny)])
    assert fit is not None
    assert fit.slope_per_s == 1.0
    assert fit.r2 == 0.0


@example([(0.0, 0.0), (5.1730367075945074e-92, 5.1730367075945074e-92)])  # found by hypothesis: the underflow
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e7, allow_nan=False) | st.integers(0, 10**7),
            st.floats(0, 1e12, allow_nan=False) | st.integers(0, 10**12),
        ),
        max_size=60,
    )
)
@budget(2.0)
def test_fit_line_is_bit_for_bit_the_old_formula(points: list[tuple[float, float]]) -> None:
    ordered = sorted(points)
    new, old = fit_line(ordered), _old_fit_line(ordered)
    assert repr(new) == repr(old)
    if new is not None and old is not None:
        assert math.copysign(1.0, new.slope_per_s) == math.copysign(1.0, old.slope_per_s)
