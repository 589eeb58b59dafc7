"""vLLM's request histograms summed over engines: counts, means and percentile buckets. Pure.

vLLM's token histograms have 1-2-5 buckets (1, 2, 5, 10, 20, 50 ... up to max_model_len), so a percentile is
only known to lie inside one bucket. The doctor uses that bucket's upper bound: a length derived from it is
never below what the traffic really needed (docs/doctor.md, "Percentiles from buckets").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.model.exposition import Exposition

PROMPT_TOKENS = "vllm:request_prompt_tokens"
GENERATION_TOKENS = "vllm:request_generation_tokens"
MAX_TOKENS_PARAM = "vllm:request_params_max_tokens"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
FAMILIES = (PROMPT_TOKENS, GENERATION_TOKENS, MAX_TOKENS_PARAM, E2E_LATENCY)
SAMPLE_NAMES = frozenset(f"{family}{suffix}" for family in FAMILIES for suffix in ("_bucket", "_sum", "_count"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Bucket:
    """The bucket (lower, upper] a percentile falls in; upper is None for the +Inf bucket."""

    lower: float
    upper: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Histogram:
    family: str
    count: int
    sum: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def percentile_bucket(self, quantile: float) -> Bucket | None:
        """The bucket holding the `quantile` (0..1) observation; None with no observations."""
        # Ranks count in the +Inf bucket, which holds every observation (_count may disagree on a broken server).
        observed = self.buckets[-1][1] if self.buckets else 0.0
        if observed <= 0:
            return None
        rank = quantile * observed
        lower = 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                return Bucket(lower=lower, upper=None if math.isinf(upper) else upper)
            lower = upper
        return Bucket(lower=lower, upper=None)

    def percentile_upper(self, quantile: float) -> float | None:
        """The upper bound of the percentile's bucket; the largest finite bound when it is the +Inf bucket."""
        bucket = self.percentile_bucket(quantile)
        if bucket is None:
            return None
        value = bucket.upper if bucket.upper is not None else bucket.lower
        return value if math.isfinite(value) and value > 0 else None


class HistogramError(ValueError):
    """The histogram's samples contradict each other (e.g. cumulative counts that go down)."""


def read_histogram(exposition: Exposition, family: str) -> Histogram | None:
    """The family summed over every series (engines, models); None when vLLM does not expose it."""
    by_bound: dict[float, float] = {}
    for sample in exposition.get(family + "_bucket"):
        raw = sample.label("le")
        if raw is None:
            raise HistogramError(f"{family}_bucket has a series without an le label")
        try:
            bound = float(raw)
        except ValueError:
            raise HistogramError(f"{family}_bucket has le={raw!r}, not a number") from None
        by_bound[bound] = by_bound.get(bound, 0.0) + sample.value
    counts = exposition.get(family + "_count")
    sums = exposition.get(family + "_sum")
    if not by_bound and not counts:
        return None
    buckets = tuple(sorted(by_bound.items()))
    previous = 0.0
    for bound, cumulative in buckets:
        if cumulative < previous or math.isnan(cumulative):
            raise HistogramError(f"{family}_bucket counts go down at le={bound:g}")
        previous = cumulative
    count = sum(sample.value for sample in counts) if counts else (buckets[-1][1] if buckets else 0.0)
    total = sum(sample.value for sample in sums)
    if math.isnan(count) or math.isnan(total) or count < 0:
        raise HistogramError(f"{family}_count or _sum is not a usable number")
    if buckets and not math.isinf(buckets[-1][0]):
        raise HistogramError(f"{family}_bucket has no le=+Inf bucket")
    return Histogram(family=family, count=int(count), sum=total, buckets=buckets)
