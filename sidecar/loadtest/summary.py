"""Sums up a load test: counts, rates, percentiles, the server's state and the verdict. Pure.

Unknown values stay None (no /metrics means "not available", not 0 preemptions). The verdict is FAIL when
the server died or more requests failed than `--max-error-rate` allows, WARN (still a success) when the
server preempted requests or its KV cache reached 95 %, PASS otherwise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sidecar.loadtest.metrics import ServerWatch
from sidecar.loadtest.result import FailureKind, RequestResult
from sidecar.loadtest.spec import LoadSpec
from sidecar.model.text import plural

KV_WARN_RATIO = 0.95
LATE_S = 0.1  # an open-loop arrival sent later than this behind its time: the client could not keep up


class Verdict(StrEnum):
    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    WARN = "WARN"
    FAIL = "FAIL"


class TokenSource(StrEnum):
    USAGE = "usage"  # every successful answer carried the server's usage
    REQUESTED = "requested"  # none did: the lengths asked for
    MIXED = "mixed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    model: str
    max_model_len: int | None
    total: int  # arrivals, dropped ones included
    sent: int
    succeeded: int
    failures: dict[FailureKind, int]  # every kind, 0 included
    # The first failure of each kind that happened, as the client saw it (one line): what a count cannot say.
    first_errors: dict[FailureKind, str]
    status_codes: dict[int, int]  # HTTP status of failed requests
    error_ratio: float | None  # failed / total; None when nothing arrived
    duration_s: float
    sending_s: float
    max_send_lag_s: float | None  # open loop: how late the client sent its latest arrival
    stopped_early: bool  # sending stopped before its bound because the server refused a connection
    requests_per_s: float | None  # sent / sending window
    completed_per_s: float | None  # succeeded / duration
    prompt_tokens: int
    output_tokens: int
    token_source: TokenSource | None  # None: nothing succeeded
    output_tokens_per_s: float | None
    total_tokens_per_s: float | None
    ttft_s: Percentiles
    e2e_s: Percentiles
    metrics_available: bool
    metrics_readings: int  # successful reads of /metrics: the peak below is the highest of these samples
    peak_kv_usage_ratio: float | None
    preemptions: float | None
    server_died: bool
    died_at_s: float | None
    died_reason: str | None
    verdict: Verdict
    verdict_line: str

    @property
    def failed(self) -> int:
        return self.total - self.succeeded


def percentile(values: Sequence[float], quantile: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * quantile
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def percentiles(values: Sequence[float]) -> Percentiles:
    return Percentiles(p50=percentile(values, 0.50), p95=percentile(values, 0.95), p99=percentile(values, 0.99))


def summarise(
    spec: LoadSpec,
    results: Sequence[RequestResult],
    *,
    model: str,
    max_model_len: int | None,
    sending_s: float,
    duration_s: float,
    watch: ServerWatch,
    max_send_lag_s: float | None = None,
    stopped_early: bool = False,
) -> Summary:
    ok = [result for result in results if result.ok]
    failures = Counter(result.failure for result in results if result.failure is not None)
    total = len(results)
    sent = total - failures[FailureKind.DROPPED_BY_CLIENT]
    with_usage = [result for result in ok if result.prompt_tokens is not None and result.completion_tokens is not None]
    prompt_tokens = sum(_prompt_tokens(result) for result in ok)
    output_tokens = sum(_output_tokens(result) for result in ok)
    e2e = percentiles([result.duration_s for result in ok])
    peak_kv = watch.peak_kv_usage_ratio
    preemptions = watch.preemptions
    error_ratio = (total - len(ok)) / total if total else None
    verdict, line = judge(
        spec,
        total=total,
        succeeded=len(ok),
        failures=failures,
        p99_e2e_s=e2e.p99,
        peak_kv_usage_ratio=peak_kv,
        preemptions=preemptions,
        died_at_s=watch.down_at_s,
        died_reason=watch.down_reason,
    )
    return Summary(
        model=model,
        max_model_len=max_model_len,
        total=total,
        sent=sent,
        succeeded=len(ok),
        failures={kind: failures[kind] for kind in FailureKind},
        first_errors=_first_errors(results),
        status_codes=_status_codes(results),
        error_ratio=error_ratio,
        duration_s=duration_s,
        sending_s=sending_s,
        max_send_lag_s=max_send_lag_s,
        stopped_early=stopped_early,
        requests_per_s=sent / sending_s if sending_s > 0 else None,
        completed_per_s=len(ok) / duration_s if duration_s > 0 else None,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        token_source=_token_source(len(ok), len(with_usage)),
        output_tokens_per_s=output_tokens / duration_s if duration_s > 0 else None,
        total_tokens_per_s=(prompt_tokens + output_tokens) / duration_s if duration_s > 0 else None,
        ttft_s=percentiles([result.ttft_s for result in ok if result.ttft_s is not None]),
        e2e_s=e2e,
        metrics_available=watch.metrics_readings > 0,
        metrics_readings=watch.metrics_readings,
        peak_kv_usage_ratio=peak_kv,
        preemptions=preemptions,
        server_died=watch.died,
        died_at_s=watch.down_at_s,
        died_reason=watch.down_reason,
        verdict=verdict,
        verdict_line=line,
    )


def judge(
    spec: LoadSpec,
    *,
    total: int,
    succeeded: int,
    failures: Counter[FailureKind],
    p99_e2e_s: float | None,
    peak_kv_usage_ratio: float | None,
    preemptions: float | None,
    died_at_s: float | None,
    died_reason: str | None,
) -> tuple[Verdict, str]:
    """The verdict and its one line."""
    failed = total - succeeded
    if died_at_s is not None:
        return Verdict.FAIL, (
            f"verdict: FAIL - server died {died_at_s:.1f} s into the run ({died_reason}); "
            f"{failed} of {plural(total, 'request')} failed"
        )
    if total == 0:
        return Verdict.FAIL, "verdict: FAIL - no request was sent"
    if failed / total > spec.max_error_rate:
        kinds = ", ".join(f"{kind} {count}" for kind, count in failures.most_common())
        return Verdict.FAIL, (
            f"verdict: FAIL - {failed} of {plural(total, 'request')} failed "
            f"({failed / total:.1%} > {spec.max_error_rate:.1%} allowed): {kinds}"
        )
    facts = (
        f"{succeeded}/{total} ok, p99 e2e {format_seconds(p99_e2e_s)}, "
        f"peak KV {format_ratio(peak_kv_usage_ratio)}, {format_preemptions(preemptions)}"
    )
    warnings = []
    if preemptions is not None and preemptions > 0:
        warnings.append("the server preempted requests")
    if peak_kv_usage_ratio is not None and peak_kv_usage_ratio >= KV_WARN_RATIO:
        warnings.append(f"the KV cache reached {KV_WARN_RATIO:.0%}")
    if warnings:
        return Verdict.WARN, f"verdict: WARN - {facts} ({'; '.join(warnings)})"
    return Verdict.PASS, f"verdict: PASS - {facts}"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "not available"
    return f"{value:.3f} s" if value < 1 else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def format_ratio(value: float | None) -> str:
    return "not available" if value is None else f"{value:.2f}"


def format_preemptions(value: float | None) -> str:
    if value is None:
        return "preemptions not available"
    count = f"{value:.0f}" if value == math.floor(value) else f"{value:.1f}"
    return f"{count} preemption" + ("" if value == 1 else "s")


def _first_errors(results: Sequence[RequestResult]) -> dict[FailureKind, str]:
    """The error line of the earliest failure of each kind (by when the request started)."""
    found: dict[FailureKind, str] = {}
    for result in sorted(results, key=lambda result: result.started_s):
        if result.failure is not None and result.failure not in found and result.error:
            found[result.failure] = result.error
    return found


def _status_codes(results: Sequence[RequestResult]) -> dict[int, int]:
    """How many failures each HTTP error status answered (not a failure after a 200, such as a cut stream)."""
    codes = Counter(
        result.status_code
        for result in results
        if not result.ok and result.status_code is not None and not 200 <= result.status_code <= 299
    )
    return dict(sorted(codes.items()))


def _prompt_tokens(result: RequestResult) -> int:
    return result.prompt_tokens if result.prompt_tokens is not None else result.requested_prompt_tokens


def _output_tokens(result: RequestResult) -> int:
    return result.completion_tokens if result.completion_tokens is not None else result.requested_output_tokens


def _token_source(succeeded: int, with_usage: int) -> TokenSource | None:
    if succeeded == 0:
        return None
    if with_usage == succeeded:
        return TokenSource.USAGE
    return TokenSource.REQUESTED if with_usage == 0 else TokenSource.MIXED
