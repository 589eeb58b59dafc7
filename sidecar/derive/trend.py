"""Least-squares line through (time, value) points, the line since their slope last changed, and whether it is
worth a forecast. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import itemgetter, mul, sub


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


# Two lines, split where they fit best, must leave at most this share of one line's squared residuals before the
# newer one is taken as the growth now. Measured on the demo's leak (tests/fixtures/gpu-memory): a steady
# staircase of leaked batches splits at best to 0.8-0.94, a pause that cut the growth to a fifth to 0.55 five
# polls later and 0.25 eight polls later; alternating noise does not split at all.
CHANGE_RESIDUAL_RATIO = 0.5


def fit_since_change(points: Sequence[tuple[float, float]], whole: LineFit, min_points: int) -> LineFit:
    """The line through the points since their slope last changed: the newer of two lines split where together
    they fit best, when they leave at most CHANGE_RESIDUAL_RATIO of the squared residuals of `whole` (the one
    line through all the points) and each holds `min_points`; else `whole`.

    One line through a window that saw the growth change (a pause that stopped the requests that leak) keeps
    the old slope for most of the window: a time to OOM from it stands still while free memory falls.
    """
    min_points = max(2, min_points)
    if len(points) < 2 * min_points:
        return whole
    split = _best_split(points, min_points)
    newer = fit_line(points[split:]) if split is not None else None
    return newer or whole


def _best_split(points: Sequence[tuple[float, float]], min_points: int) -> int | None:
    """Where two lines fit best, if they fit well enough (see fit_since_change): one pass over running sums of
    centred values (precision, as in fit_line), the sums built in C (accumulate, map)."""
    count = len(points)
    times, values = list(map(itemgetter(0), points)), list(map(itemgetter(1), points))
    d_t = list(map(sub, times, repeat(sum(times) / count)))
    d_v = list(map(sub, values, repeat(sum(values) / count)))
    # Running sums of points[:k] for k = 1..count: Σt, Σv, Σt², Σv², Σtv.
    s_t = list(accumulate(d_t))
    s_v = list(accumulate(d_v))
    s_tt = list(accumulate(map(mul, d_t, d_t)))
    s_vv = list(accumulate(map(mul, d_v, d_v)))
    s_tv = list(accumulate(map(mul, d_t, d_v)))
    t_all, v_all, tt_all, vv_all, tv_all = s_t[-1], s_v[-1], s_tt[-1], s_vv[-1], s_tv[-1]
    c_tt = tt_all - t_all * t_all / count
    if c_tt <= 0:
        return None
    one = vv_all - v_all * v_all / count - (tv_all - t_all * v_all / count) ** 2 / c_tt  # one line's residuals
    if one <= 0:
        return None
    best, best_split = math.inf, None
    first, last = min_points - 1, count - min_points  # k: the sums of points[:k + 1], each side min_points
    sums = zip(s_t[first:last], s_v[first:last], s_tt[first:last], s_vv[first:last], s_tv[first:last], strict=True)
    # Both sides' residuals as above, inline: with ten minutes of points on each of 8 GPUs this loop is most of a
    # tick's derivation (0.3 ms a GPU at 300 points, measured).
    for split, (t, v, tt, vv, tv) in enumerate(sums, start=min_points):
        rest = count - split
        c_tt, r_tt = tt - t * t / split, (tt_all - tt) - (t_all - t) ** 2 / rest
        if c_tt <= 0 or r_tt <= 0:
            continue
        c_tv, r_tv = tv - t * v / split, (tv_all - tv) - (t_all - t) * (v_all - v) / rest
        older = max(0.0, vv - v * v / split - c_tv * c_tv / c_tt)
        newer = max(0.0, (vv_all - vv) - (v_all - v) ** 2 / rest - r_tv * r_tv / r_tt)
        if older + newer < best:
            best, best_split = older + newer, split
    return best_split if best <= CHANGE_RESIDUAL_RATIO * one else None
