"""The doctor on PyTorch's own out-of-memory errors, as a real PyTorch (2.11, CUDA 13) printed them on an H200
(tests/fixtures/torch-oom, made by `python -m tests.gpu.oom_messages`; EXPECTED.md there says what the doctor
should make of each, written before it was run on them). Each file keeps the figures measured just before the
failing call, so the numbers the parser reads are checked against the process's own, not against a message
written from PyTorch's source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import CudaOom
from tests.doctor.builders import GIB, evidence, live

FIXTURES = Path(__file__).parents[1] / "fixtures" / "torch-oom"
WITH_NUMBERS = ("alone", "other_process", "fraction", "graph_capture", "expandable")
BARE = ("context_full", "cublas_handle")
DOWN = live(error="connection refused", version=None, max_model_len=None)
PRINTED = 0.005 * GIB  # PyTorch prints sizes with two decimals of their unit


def _case(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return loaded


def _oom(name: str) -> CudaOom:
    oom = parse_log(_case(name)["stderr"]).oom
    assert oom is not None, f"{name}: no out-of-memory error read"
    return oom


def _finding(name: str) -> Finding:
    findings = diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(_case(name)["stderr"]))).findings
    assert findings, f"{name}: no finding"
    return findings[0]


def test_every_case_of_the_gpu_run_is_kept() -> None:
    assert sorted(path.stem for path in FIXTURES.glob("*.json")) == sorted(WITH_NUMBERS + BARE)
    for name in WITH_NUMBERS + BARE:
        assert _case(name)["figures"]["torch"].startswith("2.11"), name


@pytest.mark.parametrize("name", WITH_NUMBERS)
def test_the_message_reads_as_the_process_measured_it(name: str) -> None:
    figures = _case(name)["figures"]
    oom = _oom(name)
    # The allocator asks for whole 2 MiB pages of a large block, then prints that.
    assert oom.tried_bytes == pytest.approx(figures["asked_bytes"], abs=PRINTED + 2 * 2**20)
    assert oom.total_bytes == pytest.approx(figures["total_bytes"], abs=PRINTED)
    # The allocator frees its cache and retries before it raises: free can grow by what was reserved unused.
    unused = figures["reserved_bytes"] - figures["allocated_bytes"]
    assert figures["free_bytes"] - PRINTED <= (oom.free_bytes or 0) <= figures["free_bytes"] + unused + PRINTED
    assert oom.allocated_bytes == pytest.approx(figures["allocated_bytes"], abs=PRINTED)
    # This process: what PyTorch reserved plus its CUDA context (about 0.5 GiB on this card).
    assert oom.process_bytes is not None
    assert 0 < oom.process_bytes - figures["reserved_bytes"] < GIB


def test_another_process_is_read_with_its_pid_and_size() -> None:
    figures = _case("other_process")["figures"]
    oom = _oom("other_process")
    assert [pid for pid, _ in oom.other_processes] == [figures["holder_pid"]]
    held = oom.other_processes[0][1]
    assert figures["holder_gib"] * GIB < held < (figures["holder_gib"] + 1) * GIB  # its tensor and its context


def test_the_fraction_cap_is_read() -> None:
    figures = _case("fraction")["figures"]
    assert _oom("fraction").allowed_bytes == pytest.approx(figures["fraction"] * figures["total_bytes"], abs=PRINTED)


@pytest.mark.parametrize(
    ("name", "names"), [("context_full", "CUDA error: out of memory"), ("cublas_handle", "CUBLAS")]
)
def test_a_bare_error_is_found_and_named_by_its_own_line(name: str, names: str) -> None:
    oom = _oom(name)
    assert oom.tried_bytes is None
    assert names in oom.message  # not PyTorch's hint after it ("Search for `cudaErrorMemoryAllocation' in ...")


def test_another_process_bounds_the_budget_by_what_it_leaves() -> None:
    figures = _case("other_process")["figures"]
    finding = _finding("other_process")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    (budget,) = [r.value for r in finding.recommendations if r.flag == "--gpu-memory-utilization"]
    left = (figures["total_bytes"] - (_oom("other_process").other_processes[0][1])) / figures["total_bytes"]
    assert isinstance(budget, float)
    assert 0.1 <= budget <= left  # 0.23: within the 0.28 the other process leaves, with vLLM's 5 % reserve


def test_the_fraction_cap_bounds_the_budget() -> None:
    figures = _case("fraction")["figures"]
    finding = _finding("fraction")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    (budget,) = [r.value for r in finding.recommendations if r.flag == "--gpu-memory-utilization"]
    assert isinstance(budget, float)
    assert budget <= figures["fraction"]


@pytest.mark.parametrize("name", ["alone", "expandable"])
def test_an_unplaced_oom_far_under_an_assumed_budget_recommends_no_budget(name: str) -> None:
    """The process held 6 % of the card under vLLM's default budget of 0.9: a lower budget frees nothing unless
    the user set one that low, and the log does not say; the finding says both and recommends no number."""
    finding = _finding(name)
    assert not finding.recommendations
    assert any("frees nothing" in step and "settles which" in step for step in finding.steps)


@pytest.mark.parametrize("name", WITH_NUMBERS + BARE)
def test_no_case_gets_a_larger_budget_or_more_gpus(name: str) -> None:
    for finding in diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(_case(name)["stderr"]))).findings:
        for recommendation in finding.recommendations:
            assert recommendation.flag not in ("--tensor-parallel-size", "--pipeline-parallel-size", "--quantization")
            if recommendation.flag == "--gpu-memory-utilization":
                assert isinstance(recommendation.value, float)
                assert recommendation.value < 0.9
