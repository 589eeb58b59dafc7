"""Histograms summed over engines, percentile buckets, and traffic read from a real exposition."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sidecar.doctor.histogram import PROMPT_TOKENS, SAMPLE_NAMES, HistogramError, read_histogram
from sidecar.doctor.traffic import read_traffic
from sidecar.parse.exposition import parse_exposition
from tests.doctor.builders import histogram

CAPTURE = Path(__file__).parents[1] / "fixtures" / "expositions" / "vllm-0.32.0-cpu-after-load.prom"


def _bucket_lines(engine: str, counts: dict[str, int], total: int, sum_: float) -> list[str]:
    labels = f'engine="{engine}",model_name="m"'
    lines = [f'vllm:request_prompt_tokens_bucket{{{labels},le="{le}"}} {count}' for le, count in counts.items()]
    return [
        *lines,
        f"vllm:request_prompt_tokens_count{{{labels}}} {total}",
        f"vllm:request_prompt_tokens_sum{{{labels}}} {sum_}",
    ]


def test_engines_are_summed_and_the_p99_bucket_found() -> None:
    text = "\n".join(
        [
            *_bucket_lines("0", {"100.0": 10, "200.0": 90, "500.0": 100, "+Inf": 100}, 100, 15000.0),
            *_bucket_lines("1", {"100.0": 0, "200.0": 50, "500.0": 99, "+Inf": 100}, 100, 25000.0),
        ]
    )
    found = read_histogram(parse_exposition(text), PROMPT_TOKENS)
    assert found is not None
    assert (found.count, found.sum, found.mean) == (200, 40000.0, 200.0)
    bucket = found.percentile_bucket(0.99)
    assert bucket is not None
    assert (bucket.lower, bucket.upper) == (200.0, 500.0)
    assert found.percentile_upper(0.5) == 200.0


def test_percentile_in_the_inf_bucket_uses_the_largest_finite_bound() -> None:
    found = histogram(PROMPT_TOKENS, [10, 20, 50_000])
    assert found.percentile_bucket(0.99) is not None
    assert found.percentile_bucket(0.99).upper is None  # type: ignore[union-attr]
    assert found.percentile_upper(0.99) == 10000.0


def test_no_observations() -> None:
    empty = histogram(PROMPT_TOKENS, [])
    assert empty.percentile_bucket(0.99) is None
    assert empty.mean is None


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['vllm:request_prompt_tokens_bucket{le="10"} 5', 'vllm:request_prompt_tokens_bucket{le="+Inf"} 3'], "go down"),
        (['vllm:request_prompt_tokens_bucket{le="ten"} 5'], "not a number"),
        (["vllm:request_prompt_tokens_bucket 5"], "without an le"),
        (['vllm:request_prompt_tokens_bucket{le="10"} 5'], r"no le=\+Inf"),
    ],
)
def test_contradictory_histograms_are_errors_not_numbers(lines: list[str], message: str) -> None:
    with pytest.raises(HistogramError, match=message):
        read_histogram(parse_exposition("\n".join(lines)), PROMPT_TOKENS)


def test_traffic_from_a_real_vllm_032_capture() -> None:
    text = CAPTURE.read_text()
    problems: list[str] = []
    traffic = read_traffic(parse_exposition(text, SAMPLE_NAMES), problems)
    assert problems == []
    assert traffic is not None
    assert traffic.requests == traffic.generation.count > 0
    assert traffic.e2e_latency is not None
    assert traffic.max_tokens is not None
    assert traffic.mean_tokens is not None
    assert math.isfinite(traffic.mean_tokens)


def test_traffic_missing_or_broken_is_a_problem_line() -> None:
    problems: list[str] = []
    assert read_traffic(parse_exposition("vllm:num_requests_running 1"), problems) is None
    broken = 'vllm:request_prompt_tokens_bucket{le="10"} 5\nvllm:request_prompt_tokens_bucket{le="+Inf"} 1'
    assert read_traffic(parse_exposition(broken), problems) is None
    assert len(problems) == 2
    assert "inconsistent" in problems[1]
