"""Percentiles, the server watch, the verdict and the report (pure)."""

from __future__ import annotations

import json

import pytest

from sidecar.loadtest.metrics import ServerWatch
from sidecar.loadtest.report import document, render_json, render_text
from sidecar.loadtest.result import FailureKind, RequestResult
from sidecar.loadtest.spec import LoadSpec
from sidecar.loadtest.summary import Summary, TokenSource, Verdict, percentile, summarise
from sidecar.model.vllm import EngineMetrics

SPEC = LoadSpec(url="http://127.0.0.1:8000", rate_per_s=10.0, duration_s=10.0, run_tag="rt")


def engine(name: str = "0", *, kv: float | None = None, preemptions: float | None = None) -> EngineMetrics:
    return EngineMetrics(
        model_name="m",
        engine=name,
        kv_cache_usage_ratio=kv,
        requests_running=None,
        requests_waiting=None,
        requests_swapped=None,
        cache_config=None,
        prefix_cache_queries_total=None,
        prefix_cache_hits_total=None,
        prefix_cache_hit_rate_gauge=None,
        preemptions_total=preemptions,
        prompt_tokens_total=None,
        generation_tokens_total=None,
        iterations_total=None,
    )


def ok(index: int, e2e_s: float, *, ttft_s: float | None = 0.1, usage: bool = True) -> RequestResult:
    return RequestResult(
        index=index,
        started_s=index * 0.1,
        duration_s=e2e_s,
        requested_prompt_tokens=100,
        requested_output_tokens=10,
        status_code=200,
        ttft_s=ttft_s,
        prompt_tokens=90 if usage else None,
        completion_tokens=10 if usage else None,
    )


def failed(index: int, kind: FailureKind, status: int | None = None) -> RequestResult:
    return RequestResult(
        index=index,
        started_s=index * 0.1,
        duration_s=0.5,
        requested_prompt_tokens=100,
        requested_output_tokens=10,
        failure=kind,
        status_code=status,
        error="x",
    )


def summary_of(results: list[RequestResult], watch: ServerWatch | None = None, spec: LoadSpec = SPEC) -> Summary:
    return summarise(
        spec,
        results,
        model="m",
        max_model_len=None,
        sending_s=10.0,
        duration_s=12.0,
        watch=watch or ServerWatch(),
    )


def test_percentiles_interpolate_like_numpy() -> None:
    values = [float(value) for value in range(1, 101)]
    assert percentile(values, 0.5) == pytest.approx(50.5)
    assert percentile(values, 0.95) == pytest.approx(95.05)
    assert percentile(values, 0.99) == pytest.approx(99.01)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_watch_keeps_the_peak_over_engines_and_counts_preemptions_from_the_baseline() -> None:
    watch = ServerWatch()
    assert (watch.peak_kv_usage_ratio, watch.preemptions) == (None, None)
    watch.observe_metrics([engine("0", kv=0.2, preemptions=40.0), engine("1", kv=0.5, preemptions=7.0)])
    assert (watch.peak_kv_usage_ratio, watch.preemptions) == (0.5, 0.0)
    watch.observe_metrics([engine("0", kv=0.9, preemptions=43.0), engine("1", kv=0.1, preemptions=7.0)])
    watch.observe_metrics([engine("0", kv=0.3, preemptions=44.0), engine("1", kv=0.1, preemptions=9.0)])
    assert (watch.peak_kv_usage_ratio, watch.preemptions) == (0.9, 6.0)


def test_a_counter_reset_is_never_a_negative_increase() -> None:
    watch = ServerWatch()
    watch.observe_metrics([engine(preemptions=100.0)])
    watch.observe_metrics([engine(preemptions=103.0)])
    watch.observe_metrics([engine(preemptions=2.0)])  # the server restarted: 2 since then
    watch.observe_metrics([engine(preemptions=5.0)])
    assert watch.preemptions == 8.0


def test_watch_keeps_the_earliest_sign_of_death() -> None:
    watch = ServerWatch()
    watch.observe_down(5.0, "connection refused")
    watch.observe_down(3.0, "connection reset")
    watch.observe_down(4.0, "/health answered HTTP 503")
    assert (watch.died, watch.down_at_s, watch.down_reason) == (True, 3.0, "connection reset")


def test_pass_with_counts_rates_and_percentiles() -> None:
    results = [ok(index, 1.0 + index / 100) for index in range(100)]
    watch = ServerWatch()
    watch.observe_metrics([engine(kv=0.83, preemptions=3.0)])
    summary = summary_of(results, watch)
    assert summary.verdict is Verdict.PASS
    assert summary.verdict_line == "verdict: PASS - 100/100 ok, p99 e2e 1.98 s, peak KV 0.83, 0 preemptions"
    assert (summary.total, summary.sent, summary.succeeded, summary.failed, summary.error_ratio) == (
        100,
        100,
        100,
        0,
        0,
    )
    assert summary.requests_per_s == 10.0
    assert summary.output_tokens_per_s == pytest.approx(1000 / 12)
    assert summary.total_tokens_per_s == pytest.approx(10_000 / 12)
    assert summary.token_source is TokenSource.USAGE
    assert summary.e2e_s.p50 == pytest.approx(1.495)
    assert summary.ttft_s.p99 == pytest.approx(0.1)


def test_requested_lengths_stand_in_for_a_missing_usage() -> None:
    summary = summary_of([ok(0, 1.0, usage=False), ok(1, 1.0)])
    assert (summary.prompt_tokens, summary.output_tokens) == (190, 20)
    assert summary.token_source is TokenSource.MIXED
    assert summary_of([ok(0, 1.0, usage=False)]).token_source is TokenSource.REQUESTED


def test_errors_within_the_allowed_rate_pass() -> None:
    results = [ok(index, 1.0) for index in range(199)] + [failed(199, FailureKind.TIMEOUT)]
    summary = summary_of(results)
    assert summary.verdict is Verdict.PASS
    assert summary.verdict_line.startswith("verdict: PASS - 199/200 ok")


def test_too_many_errors_fail() -> None:
    results = [ok(index, 1.0) for index in range(90)]
    results += [failed(90 + index, FailureKind.HTTP_5XX, 503) for index in range(8)]
    results += [failed(98, FailureKind.DROPPED_BY_CLIENT), failed(99, FailureKind.HTTP_4XX, 400)]
    summary = summary_of(results)
    assert summary.verdict is Verdict.FAIL
    assert summary.verdict_line == (
        "verdict: FAIL - 10 of 100 requests failed (10.0% > 1.0% allowed): http_5xx 8, dropped_by_client 1, http_4xx 1"
    )
    assert summary.sent == 99
    assert summary.status_codes == {400: 1, 503: 8}


def test_a_dead_server_fails_whatever_the_error_rate() -> None:
    watch = ServerWatch()
    watch.observe_down(41.23, "connection refused")
    results = [ok(index, 1.0) for index in range(83)] + [
        failed(83 + index, FailureKind.CONNECTION_REFUSED) for index in range(37)
    ]
    summary = summary_of(results, watch)
    assert summary.verdict is Verdict.FAIL
    assert summary.verdict_line == (
        "verdict: FAIL - server died 41.2 s into the run (connection refused); 37 of 120 requests failed"
    )


@pytest.mark.parametrize(
    ("kv", "preemptions", "why"),
    [(0.96, 0.0, "the KV cache reached 95%"), (0.5, 4.0, "the server preempted requests")],
)
def test_pressure_warns(kv: float, preemptions: float, why: str) -> None:
    watch = ServerWatch()
    watch.observe_metrics([engine(kv=kv, preemptions=10.0)])
    watch.observe_metrics([engine(kv=kv, preemptions=10.0 + preemptions)])
    summary = summary_of([ok(0, 1.0)], watch)
    assert summary.verdict is Verdict.WARN
    assert summary.verdict_line.endswith(f"({why})")


def test_nothing_sent_fails() -> None:
    assert summary_of([]).verdict_line == "verdict: FAIL - no request was sent"


def test_json_has_every_section_and_null_for_the_unknown() -> None:
    summary = summary_of([failed(0, FailureKind.TIMEOUT)])
    parsed = json.loads(render_json(SPEC, summary))
    assert parsed == document(SPEC, summary)
    assert set(parsed) == {
        "target",
        "load",
        "requests",
        "duration_s",
        "sending_s",
        "max_send_lag_s",
        "throughput",
        "latency_s",
        "server",
        "verdict",
        "verdict_line",
    }
    assert parsed["server"] == {
        "metrics_available": False,
        "metrics_readings": 0,
        "peak_kv_cache_usage_ratio": None,
        "preemptions": None,
        "died": False,
        "died_at_s": None,
        "died_reason": None,
    }
    assert parsed["latency_s"] == {
        "ttft": {"p50": None, "p95": None, "p99": None},
        "e2e": {"p50": None, "p95": None, "p99": None},
    }
    assert parsed["throughput"]["token_source"] is None
    assert parsed["requests"]["failures"]["timeout"] == 1
    assert set(parsed["requests"]["failures"]) == {str(kind) for kind in FailureKind}
    assert parsed["load"]["mode"] == "open_loop"
    assert parsed["verdict"] == "FAIL"


def test_text_report_says_what_is_not_available() -> None:
    text = render_text(SPEC, summary_of([ok(0, 1.5, ttft_s=None)]))
    lines = dict(line.split(":", 1) for line in text.splitlines()[1:] if not line.startswith("verdict"))
    assert lines["TTFT"].strip() == "not available"
    assert lines["KV cache"].strip() == "peak usage not available (the server has no vLLM /metrics)"
    assert lines["preemptions"].strip() == "not available (the server has no vLLM /metrics)"
    assert lines["server"].strip() == "up at the end"
    assert text.splitlines()[-1] == (
        "verdict: PASS - 1/1 ok, p99 e2e 1.50 s, peak KV not available, preemptions not available"
    )


def test_a_client_that_fell_behind_its_schedule_says_so() -> None:
    results = [ok(0, 1.0)]
    on_time = summarise(SPEC, results, model="m", max_model_len=None, sending_s=1, duration_s=1, watch=ServerWatch())
    assert "keep up" not in render_text(SPEC, on_time)
    late = summarise(
        SPEC, results, model="m", max_model_len=None, sending_s=1, duration_s=1, watch=ServerWatch(), max_send_lag_s=0.4
    )
    assert "requests/s sent (the client sent some arrivals up to 0.400 s late: it could not keep up)" in render_text(
        SPEC, late
    )
    assert json.loads(render_json(SPEC, late))["max_send_lag_s"] == 0.4


def test_the_kv_peak_says_how_many_readings_it_is_the_highest_of() -> None:
    watch = ServerWatch()
    for usage in (0.2, 0.7, 0.4):
        watch.observe_metrics([engine(kv=usage)])
    summary = summary_of([ok(0, 1.5)], watch)
    assert summary.metrics_readings == 3
    text = render_text(SPEC, summary)
    assert "KV cache:     peak usage 0.70 (the highest of 3 /metrics readings)" in text.splitlines()
    assert document(SPEC, summary)["server"]["metrics_readings"] == 3
