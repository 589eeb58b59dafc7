"""Least-squares line through (time, value) points, and whether it is worth a forecast. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
    mean_t = sum(t for t, _ in points) / count
    mean_v = sum(v for _, v in points) / count
    # Centred sums: monotonic seconds (~1e6) times bytes (~1e11) would lose precision uncentred.
    s_tt = sum((t - mean_t) ** 2 for t, _ in points)
    s_tv = sum((t - mean_t) * (v - mean_v) for t, v in points)
    s_vv = sum((v - mean_v) ** 2 for _, v in points)
    if s_tt == 0:
        return None
    slope = s_tv / s_tt
    r2 = (s_tv * s_tv) / (s_tt * s_vv) if s_vv > 0 else 0.0
    return LineFit(slope_per_s=slope, r2=r2, points=count, span_s=points[-1][0] - points[0][0])
