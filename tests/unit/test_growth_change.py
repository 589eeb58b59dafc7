"""The growth a forecast divides by: the slope since it last changed, not one line through the whole window.

The recorded series (tests/fixtures/gpu-memory/leak-paused.json) is the demo's leak as the daemon saw it: the
sidecar paused admission, the leak slowed to its drift, and one line through the window kept forecasting 22 s
for ten polls while free memory fell.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.trend import CHANGE_RESIDUAL_RATIO, LineFit, fit_line, fit_since_change
from sidecar.derive.window import Window
from tests.unit.builders import device, snapshot

MIB = 2**20
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-memory" / "leak-paused.json"


def _recorded() -> tuple[int, list[tuple[float, float]]]:
    document = json.loads(RECORDED.read_text())
    return int(document["total_bytes"]), [(float(t), float(used)) for t, used in document["points"]]


def _forecasts(points: list[tuple[float, float]], total: int) -> list[tuple[float, float | None, float | None]]:
    """(time, growth, time to OOM) of each tick, the Deriver fed one recorded point a tick."""
    deriver = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30))
    window = Window(span_s=600)
    ticks = []
    for t, used in points:
        window.push(snapshot(t, devices=(device(used=int(used), total=total),)))
        (gpu,) = deriver.derive(window).gpus
        ticks.append((t, gpu.memory_growth_bytes_per_second, gpu.time_to_oom_seconds))
    return ticks


def test_the_recorded_forecast_counts_down_through_the_pause() -> None:
    total, points = _recorded()
    ticks = _forecasts(points, total)
    forecasts = [(t, growth, tto) for t, growth, tto in ticks if tto is not None and growth is not None]
    assert forecasts[0][0] < 35.0, "a forecast under load, before the pause took effect"
    for t, growth, _ in forecasts:
        if t < 35.0:
            assert 120 * MIB < growth < 180 * MIB, (t, growth)  # the leak under load
    settled = [(t, growth, tto) for t, growth, tto in forecasts if t >= 42.0]  # 6 polls after the last batch
    assert settled, "forecasts after the pause"
    for t, growth, tto in settled:
        assert 28 * MIB < growth < 34 * MIB, (t, growth)  # the drift alone
        assert 80.0 < tto < 120.0, (t, tto)
    times_to_oom = [tto for _, _, tto in settled]
    assert times_to_oom == sorted(times_to_oom, reverse=True), "it counts down"
    assert len(set(times_to_oom)) == len(times_to_oom)


def test_one_line_through_the_window_would_stand_still() -> None:
    # What the screen showed before: the pause's slower growth hidden under 30 s of the fast one.
    total, points = _recorded()
    late = [p for p in points if p[0] >= 42.0]
    frozen = []
    for end in range(len(points) - len(late), len(points)):
        whole = fit_line(points[: end + 1])
        assert whole is not None
        frozen.append((total - points[end][1]) / whole.slope_per_s)
    assert max(frozen) - min(frozen) < 1.0


def _line(slope: float, count: int, start_t: float = 1000.0, start_v: float = 6e10) -> list[tuple[float, float]]:
    return [(start_t + 2.0 * i, start_v + slope * 2.0 * i) for i in range(count)]


def test_a_clean_change_takes_the_newer_line() -> None:
    older = _line(100 * MIB, 30)
    t, v = older[-1]
    newer = [(t + 2.0 * i, v + 10 * MIB * 2.0 * i) for i in range(1, 9)]
    points = older + newer
    whole = fit_line(points)
    assert whole is not None
    current = fit_since_change(points, whole, 6)
    assert current.slope_per_s == pytest.approx(10 * MIB)
    assert current.points in (8, 9)  # the corner point fits both lines exactly


def test_the_newer_line_follows_a_change_as_its_points_come() -> None:
    older = _line(100 * MIB, 30)
    t, v = older[-1]
    slopes = []
    for after in range(1, 9):
        points = older + [(t + 2.0 * i, v + 10 * MIB * 2.0 * i) for i in range(1, after + 1)]
        whole = fit_line(points)
        assert whole is not None
        current = fit_since_change(points, whole, 6)
        assert current.points >= 6
        slopes.append(current.slope_per_s)
    assert slopes == sorted(slopes, reverse=True), "from the old slope towards the new, never past it"
    assert slopes[0] > 90 * MIB
    assert slopes[-1] == pytest.approx(10 * MIB)


def test_steady_growth_and_noise_keep_the_whole_line() -> None:
    rng = random.Random(3)  # noqa: S311 - test series, not secrets
    steady = [(1000.0 + 2 * i, 6e10 + 50 * MIB * 2 * i + rng.uniform(-200, 200) * MIB) for i in range(100)]
    whole = fit_line(steady)
    assert whole is not None
    assert fit_since_change(steady, whole, 6) is whole
    exact = _line(50 * MIB, 40)
    whole = fit_line(exact)
    assert whole is not None
    assert fit_since_change(exact, whole, 6) is whole, "no residual to halve"


def _brute_force(points: list[tuple[float, float]], min_points: int) -> LineFit:
    """The obvious way: every split refitted from scratch."""

    def residual(part: list[tuple[float, float]]) -> float:
        fit = fit_line(part)
        assert fit is not None
        mean_t = sum(t for t, _ in part) / len(part)
        mean_v = sum(v for _, v in part) / len(part)
        return sum((v - mean_v - fit.slope_per_s * (t - mean_t)) ** 2 for t, v in part)

    whole = fit_line(points)
    assert whole is not None
    one = residual(points)
    splits = [(residual(points[:k]) + residual(points[k:]), k) for k in range(min_points, len(points) - min_points + 1)]
    best, split = min(splits)
    if one <= 0 or best > CHANGE_RESIDUAL_RATIO * one:
        return whole
    newer = fit_line(points[split:])
    assert newer is not None
    return newer


@pytest.mark.parametrize("seed", range(40))
def test_the_split_is_the_brute_forces(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test series, not secrets
    count = rng.randint(12, 300)
    corner = rng.randint(3, count - 3)
    slopes = (rng.uniform(-50, 200) * MIB, rng.uniform(-50, 200) * MIB)
    noise = rng.choice((0.0, 1.0, 50.0, 500.0, 5000.0)) * MIB
    walk = seed % 2 == 0  # noise that adds up (a random walk) or noise around the two lines
    points, value = [], 7e10
    for i in range(count):
        value += slopes[i >= corner] * 2.0 + (rng.gauss(0.0, noise) if walk else 0.0)
        wobble = 0.0 if walk else rng.gauss(0.0, noise)
        points.append((5e5 + 2.0 * i + rng.uniform(-0.2, 0.2), value + wobble))
    whole = fit_line(points)
    assert whole is not None
    expected = _brute_force(points, 6)
    got = fit_since_change(points, whole, 6)
    assert got.points == expected.points, (got, expected)
    assert got.slope_per_s == pytest.approx(expected.slope_per_s, rel=1e-9, abs=1e-3)
