"""The filtered parse skims the families it keeps nothing of (sidecar.parse.skim); that must change nothing.

The oracle is the line parser the skim stands in for (`parse_lines`, private, used here on purpose): the same
samples in the same order, the same types in the same order, the same names seen and line count, and the same
error, numbered the same, for the recorded captures, the simulator's expositions, and both broken in the ways
that matter (a line inserted, dropped, doubled or swapped, a truncated body, CRLF line ends).
"""

from __future__ import annotations

from collections.abc import Collection

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.doctor.histogram import SAMPLE_NAMES
from sidecar.model.exposition import Exposition
from sidecar.parse import exposition as line_module
from sidecar.parse.exposition import ExpositionError, parse_exposition
from sidecar.parse.vllm import KEPT_SAMPLES
from sidecar.sim.exposition import MetricsWriter
from sidecar.sim.exposition_cache import CacheSettings
from tests.conftest import exposition_files
from tests.property.profile import budget

Outcome = tuple[object, ...] | str


def _outcome(text: str, keep: Collection[str] | None, *, skim: bool) -> Outcome:
    try:
        parsed: Exposition = parse_exposition(text, keep) if skim else line_module.parse_lines(text, keep)
    except ExpositionError as error:
        return f"{error} (line {error.line_number}, {error.reason})"
    # repr: NaN values compare equal to themselves, and dict order is part of the answer.
    return (repr(parsed.samples), list(parsed.types.items()), parsed.names_seen)


def _check(text: str, keep: Collection[str] | None) -> None:
    assert _outcome(text, keep, skim=True) == _outcome(text, keep, skim=False)


def _simulated(version: str, engines: int) -> str:
    cache = CacheSettings(max_model_len=4096, num_gpu_blocks_per_engine=1000)
    return MetricsWriter(version, model_name="m", cache=cache, engines=engines).render(()).decode()


# Shapes the skim must leave to the line parser, or take only partly: a summary with quantiles, a histogram
# with a series missing its _sum, families without HELP, a kept name inside a foreign family.
ODD_FAMILIES = """# HELP s a summary with quantiles
# TYPE s summary
s{quantile="0.5"} 1
s_count 2
s_sum 3
# HELP t a summary without
# TYPE t summary
t_count{a="1"} 2
t_sum{a="1"} 3.5
# HELP h a histogram cut short
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 2
h_count 2
h_bucket{le="1"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
# HELP g a gauge
# TYPE g gauge
g 1
vllm:num_requests_waiting{engine="0",model_name="m"} 4
"""
TEXTS = (
    [path.read_text() for path in exposition_files()]
    + [ODD_FAMILIES]
    + [_simulated(version, engines) for version, engines in (("0.6", 1), ("0.10", 1), ("0.32", 1), ("0.32", 3))]
)
KEEPS: list[frozenset[str]] = [KEPT_SAMPLES, KEPT_SAMPLES | SAMPLE_NAMES, frozenset()]
TRICKY_LINES = [
    "",
    " ",
    "\r",
    "\t# TYPE vllm:kv_cache_usage_perc gauge",
    "# HELP vllm:num_requests_running",
    "# HELP x help",
    "# TYPE x gauge",
    "# TYPE x flavour",
    "# TYPE vllm:iteration_tokens_total histogram",
    "x 1",
    "x 1.2.3",
    'x{a="1"} oops',
    "# TYPE x summary",
    "x_count 1",
    "x_sum 2",
    'x{quantile="0.5"} 1',
    'x_bucket{le="1"} 1',
    'vllm:num_requests_running{engine="0",model_name="m"} 3',
    'vllm:num_requests_running{engine="0",model_name="m"} x',
    "vllm:num_requests_running 1 2 3",
    'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 7',
    " vllm:num_requests_waiting 2",
    'vllm:kv_cache_usage_perc {engine="0"} 0.5',
    "vllm:prompt_tokens_created 1.7e9",
    "not an exposition at all",
    "<html><body>502</body></html>",
    "\x00\x01binary",
]


@pytest.mark.parametrize("keep", KEEPS, ids=["tick", "doctor", "nothing"])
@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_whole_expositions_read_the_same(index: int, keep: frozenset[str]) -> None:
    text = TEXTS[index]
    _check(text, keep)
    _check(text.replace("\n", "\r\n"), keep)  # CRLF: nothing is skimmed, all of it goes to the line parser


@given(data=st.data())
@budget(2.0)
def test_broken_expositions_read_and_fail_the_same(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(TEXTS))
    broken = broken_exposition(data, text)
    keep = data.draw(st.sampled_from([*KEEPS, None]) | st.frozensets(st.sampled_from(sorted(KEPT_SAMPLES))))
    _check(broken, keep)


def broken_exposition(data: st.DataObject, text: str) -> str:
    """`text` broken in the ways that matter: one to three lines inserted (tricky or arbitrary), dropped,
    doubled, swapped, or the body truncated in the middle of a line."""
    lines = text.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        kind = data.draw(st.sampled_from(["insert", "drop", "double", "swap", "truncate"]))
        if kind == "insert":
            lines.insert(at, data.draw(st.sampled_from(TRICKY_LINES) | st.text(max_size=20)))
        elif kind == "drop" and len(lines) > 1:
            del lines[at]
        elif kind == "double":
            lines.insert(at, lines[at])
        elif kind == "swap":
            other = data.draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif kind == "truncate":
            cut = data.draw(st.integers(0, len(lines[at])))
            lines = [*lines[:at], lines[at][:cut]]
    return "\n".join(lines)


@given(text=st.text(alphabet='# HELPTYPEx_bucketcountsum{}="0123456789.NaInf \n\t\r:gaugehistogram', max_size=300))
@budget()
def test_any_text_reads_and_fails_the_same(text: str) -> None:
    _check(text, KEPT_SAMPLES)
    _check(text, {"x", "x_count"})
