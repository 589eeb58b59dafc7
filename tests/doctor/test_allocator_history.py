"""Allocator fragmentation from the daemon's allocator probe (/status `allocators`): the numbers of the H200 run
(docs/gpu-runs.md: the daemon's /status while a workload fragmented its allocator) become an
allocator_fragmentation finding with expandable segments; retries with little fragmentation do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Severity
from sidecar.doctor.history import HistoryError
from sidecar.doctor_cli.history_reading import status_history
from tests.doctor.builders import evidence, live

STATUS = Path(__file__).parent / "status"
# /status "allocators" as the daemon served it on the H200 (tests/gpu/test_daemon_on_gpu.py), word for word.
H200 = {
    "gpu": 0,
    "rank": "none",
    "processes": 1,
    "allocated_bytes": 3251269120,
    "reserved_bytes": 4240441344,
    "inactive_split_bytes": 989172224,
    "fragmentation_ratio": 0.23327105453295005,
    "alloc_retries_total": 7,
    "ooms_total": 4,
    "alloc_retries_recent": 7,
    "ooms_recent": 4,
}


def _diagnose(*allocators: dict[str, Any]) -> list[Any]:
    document: dict[str, Any] = json.loads((STATUS / "kv-pressure.json").read_text())
    document["allocators"] = list(allocators)
    ev = evidence(live_evidence=live(error="unreachable"), history_facts=status_history(document, "/status"))
    return [f for f in diagnose(ev).findings if f.cause is Cause.ALLOCATOR_FRAGMENTATION]


def test_the_h200_run_is_allocator_fragmentation_with_expandable_segments() -> None:
    (finding,) = _diagnose(H200)
    assert finding.severity is Severity.CRITICAL  # allocations failed: OOMs inside vLLM
    assert finding.evidence == (
        "GPU 0: 0.92 GiB of the 3.95 GiB PyTorch reserved (23%) lies in split free pieces (inactive split bytes), "
        "with 7 allocation retries and 4 out-of-memory errors since vLLM started (the sidecar's allocator probe, "
        "/status)",
    )
    (recommendation,) = finding.recommendations
    assert (recommendation.flag, recommendation.value) == ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert "23% >= 20%" in recommendation.why


def test_retries_without_fragmentation_and_fragmentation_without_retries_are_not_this_cause() -> None:
    assert _diagnose({**H200, "inactive_split_bytes": 100 << 20}) == []  # 2 %: the batch needs more room
    assert _diagnose({**H200, "alloc_retries_total": 0, "ooms_total": 0}) == []  # split, but nothing failed
    assert _diagnose() == []
    with pytest.raises(HistoryError, match=r"allocators\.0\.processes: field required"):
        _diagnose({"gpu": 0, "rank": "0"})  # an entry without its numbers is no /status the daemon wrote


def test_retries_alone_are_a_warning_with_the_rank() -> None:
    (finding,) = _diagnose({**H200, "rank": "1", "ooms_total": 0})
    assert finding.severity is Severity.WARNING
    assert finding.evidence[0].startswith("GPU 0 rank 1: ")
