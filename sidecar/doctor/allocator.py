"""Allocator fragmentation seen live: the daemon's allocator probe (a vLLM plugin reading PyTorch's caching
allocator in each vLLM process) found a large share of the reserved memory in split free pieces, and allocations
that had to be retried or failed. That is PyTorch's own account, not an estimate; the remedy is the allocator's
expandable segments. Retries with little fragmentation are not this cause (the batch itself needs more room).
Pure.
"""

from __future__ import annotations

from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.overshoot import ALLOC_CONF, EXPANDABLE
from sidecar.doctor.setup import Setup
from sidecar.model.status import AllocatorStatus
from sidecar.model.text import plural

FRAGMENTED_RATIO = 0.2  # inactive split / reserved at or above this, with retries or OOMs: fragmentation


def _fragmented(allocator: AllocatorStatus) -> float | None:
    if allocator["reserved_bytes"] <= 0 or not (allocator["alloc_retries_total"] or allocator["ooms_total"]):
        return None
    ratio = allocator["inactive_split_bytes"] / allocator["reserved_bytes"]
    return ratio if ratio >= FRAGMENTED_RATIO else None


def history_allocator(evidence: Evidence, setup: Setup) -> Finding | None:
    del setup  # expandable segments exist in every PyTorch that vLLM 0.5+ runs on (2.1+)
    history = evidence.history
    if history is None:
        return None
    fragmented = [(a, ratio) for a in history.allocators if (ratio := _fragmented(a)) is not None]
    if not fragmented:
        return None
    lines = []
    for allocator, ratio in fragmented:
        rank = "" if allocator["rank"] == "none" else f" rank {allocator['rank']}"
        lines.append(
            f"GPU {allocator['gpu']}{rank}: {gib(allocator['inactive_split_bytes'])} of the "
            f"{gib(allocator['reserved_bytes'])} "
            f"PyTorch reserved ({ratio:.0%}) lies in split free pieces (inactive split bytes), with "
            f"{allocator['alloc_retries_total']} allocation retries and {allocator['ooms_total']} out-of-memory "
            "errors since "
            f"vLLM started (the sidecar's allocator probe, {history.source})"
        )
    worst, ratio = max(fragmented, key=lambda pair: pair[1])
    why = (
        f"{ratio:.0%} >= {FRAGMENTED_RATIO:.0%} of the reserved memory is in pieces too small for the next tensor, and "
        f"the allocator had to free its cache and retry {plural(worst['alloc_retries_total'], 'time')}: expandable "
        "segments let it grow a segment in place instead of splitting (set it in vLLM's environment and restart vLLM)"
    )
    return Finding(
        cause=Cause.ALLOCATOR_FRAGMENTATION,
        severity=Severity.CRITICAL if any(a["ooms_total"] for a, _ in fragmented) else Severity.WARNING,
        summary="PyTorch's allocator inside vLLM is fragmented: reserved memory it cannot use, and retries",
        evidence=tuple(lines),
        recommendations=(Recommendation(flag=ALLOC_CONF, value=EXPANDABLE, why=why),),
    )
