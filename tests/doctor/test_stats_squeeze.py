"""V1 before 0.11.2 counts no preemption in its stats line, but a KV cache that squeezes the running requests
shows in it: at a full cache, fewer and fewer run while requests wait. Lines in vLLM 0.10's stats format; the
counts are made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)


def _stats(running: int, waiting: int, usage: float) -> str:
    return (
        "INFO 08-01 10:21:04 [loggers.py:122] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        f"throughput: 2400.0 tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: "
        f"{usage:.1f}%, Prefix cache hit rate: 0.0%"
    )


def _findings(series: list[tuple[int, int, float]]) -> tuple[Finding, ...]:
    text = "\n".join(_stats(*line) for line in series)
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings


def test_a_full_cache_that_squeezes_the_running_requests_sizes_max_num_seqs() -> None:
    findings = _findings([(200, 0, 80.0), (240, 10, 99.0), (190, 60, 100.0), (150, 100, 99.8)])
    assert findings[0].cause is Cause.CONCURRENCY_MISJUDGEMENT
    # 150 running filled 99.8 %: 150 / 0.998 = 150.3 requests at their longest, x 0.9 headroom -> 135
    assert {r.flag: r.value for r in findings[0].recommendations}["--max-num-seqs"] == 135


def test_a_full_cache_that_keeps_its_running_requests_is_a_busy_server_not_a_finding() -> None:
    """The same cache full with requests waiting, but as many running throughout: it is at capacity, and nothing
    says that fewer admitted would serve better."""
    findings = _findings([(200, 0, 80.0), (240, 10, 99.0), (232, 40, 100.0), (236, 30, 99.8)])
    assert all("--max-num-seqs" not in {r.flag for r in finding.recommendations} for finding in findings)


def test_one_request_that_fills_the_cache_says_it_holds_about_one_and_sets_no_number() -> None:
    findings = _findings([(1, 0, 91.0), (1, 0, 95.6)])
    assert findings[0].cause is Cause.KV_CACHE_BLOWOUT
    assert findings[0].recommendations == ()  # the cache's size in tokens is not in the log
    assert "95.6%" in findings[0].summary
    # Below 90 %, or two requests sharing it, is not one request outgrowing the cache.
    assert _findings([(1, 0, 60.0), (1, 0, 85.0)]) == ()
    assert all(f.cause is not Cause.KV_CACHE_BLOWOUT for f in _findings([(2, 0, 96.0)]))


def test_the_line_after_a_full_cache_shows_the_squeeze_its_preemptions_freed() -> None:
    """Preempted requests free their blocks before the next stats line is printed: that line's usage is below
    full, its running fewer, and it sizes max_num_seqs from its requests' share of the cache."""
    findings = _findings([(256, 744, 96.0), (189, 766, 91.4), (250, 530, 99.4), (199, 499, 92.9)])
    assert findings[0].cause is Cause.CONCURRENCY_MISJUDGEMENT
    # 199 running filled 92.9 %: 214.2 requests at those sizes, x 0.9 headroom -> 192. The drop to 189 follows a
    # line at 96 %, not a full cache, so it does not count.
    assert {r.flag: r.value for r in findings[0].recommendations}["--max-num-seqs"] == 192
