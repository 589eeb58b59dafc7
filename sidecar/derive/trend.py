"""Least-squares line through (time, value) points, and whether it is worth a forecast. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul


@dataclass(frozen=True, slots=True, kw_only=True)
class LineFit:
    slope_per_s: float
    r2: float  # share of the variance the line explains; 0 when the values do not vary
    points: int
    span_s: float


def fit_line(points: Sequence[tuple[float, float]]) -> LineFit | None:
    """Ordinary least squares; None for fewer than two points or no spread in time."""
    count = len(points)
    if count < 2:
        return None
    times = [t for t, _ in points]
    values = [v for _, v in points]
    mean_t = sum(times) / count
    mean_v = sum(values) / count
    # Centred sums: monotonic seconds (~1e6) times bytes (~1e11) would lose precision uncentred. The same
    # operations in the same order as one expression per term, with the loops in C (map over builtins):
    # a forecast refits every GPU's ten minutes of points every tick.
    d_t = [t - mean_t for t in times]
    d_v = [v - mean_v for v in values]
    s_tt = sum(map(pow, d_t, repeat(2)))
    s_tv = sum(map(mul, d_t, d_v))
    s_vv = sum(map(pow, d_v, repeat(2)))
    if s_tt == 0:
        return None
    slope = s_tv / s_tt
    # Both sums may be positive and their product still underflow to 0 (spreads of 1e-92): no fit, not a crash.
    spread = s_tt * s_vv
    r2 = (s_tv * s_tv) / spread if spread > 0 else 0.0
    return LineFit(slope_per_s=slope, r2=r2, points=count, span_s=points[-1][0] - points[0][0])
