"""vLLM's start checks on the card's memory, read as findings. Pure.

* Free memory below the budget: another process holds the rest; the budget must fit in what is free. With 0.32+'s
  IPC weight cache the weights another process holds for vLLM count inside its budget, and can exceed it alone.
* The memory profile's own check (free memory did not fall while vLLM loaded and profiled): the card's free count
  moved underneath vLLM (another process freed memory) or is not the device's (a GPU-sharing layer): no flag.
"""

from __future__ import annotations

from sidecar.doctor import formula, remedies
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import Refusal


def free_memory_refusal(refusal: Refusal, ledger: MemoryLedger) -> Finding:
    """The refusal states every amount it needs: free and total at start, the budget asked for."""
    free = (refusal.free_gib or 0.0) * GIB
    total = (refusal.total_gib or 0.0) * GIB
    external = (refusal.external_weights_gib or 0.0) * GIB  # held elsewhere for vLLM, inside its budget
    others = total - free - external
    asked = (
        f"gpu_memory_utilization {refusal.utilization:g} asks for {refusal.requested_gib:.2f} GiB"
        if refusal.utilization is not None and refusal.requested_gib is not None
        else "the budget asked for is cut off in the log"
    )
    if external:
        asked += f" beside the {gib(external)} of weights another process holds for it, inside the budget"
    lines = [
        f"vLLM refused to start: {refusal.line}",
        f"free at start {gib(free)} of {gib(total)}; {asked}: {gib(others)} is held by other "
        "processes (or a previous vLLM)",
    ]
    recommendations: list[Recommendation] = []
    if total > 0:
        computed = formula.utilization(int(total), int(others), 0)
        if computed.value >= remedies.MIN_USEFUL_UTILIZATION:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
        else:
            lines.append(
                f"what is left would be gpu_memory_utilization {computed.value:.2f} with the 5 % reserve, too little "
                "to serve a model of any size: free the GPU first (a previous vLLM still exiting, another job), or "
                "move vLLM to another GPU"
            )
            leftover = remedies.leftover_budget(total, free, ledger.weights)
            if leftover is not None:
                recommendations.append(leftover)
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the card has less free memory than gpu_memory_utilization asks for",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def external_weights(refusal: Refusal) -> Finding:
    """Weights another process holds for vLLM (0.32+'s IPC weight cache) count against its budget; here they alone
    exceed it. The budget must hold them and the engine's own memory, which the refusal does not size: a step."""
    held, total = refusal.external_weights_gib or 0.0, refusal.total_gib or 0.0
    share = held / total if total else None
    above = f" above {share:.2f} ({held:.2f} of {total:.2f} GiB)" if share is not None else ""
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the weights another process holds for it exceed gpu_memory_utilization",
        evidence=(
            f"vLLM refused to start: {refusal.line}",
            "the externally held weights count against vLLM's budget; the engine's activations and KV cache must "
            "fit in what the budget leaves beside them",
        ),
        steps=(
            f"raise --gpu-memory-utilization{above} by what the engine needs for its activations and KV cache "
            "(vLLM's next start says whether free memory allows it), or hold fewer weights outside the engine",
        ),
    )


def profile_check(refusal: Refusal) -> Finding:
    """vLLM sizes its KV cache from how far the card's free memory fell while it loaded and profiled: when free
    memory did not fall, that reading is not vLLM's alone, and no budget, length or batch changes it."""
    lines = [f"vLLM refused to start: {refusal.line}"]
    if refusal.free_gib is not None and refusal.free_after_gib is not None:
        rose = refusal.free_after_gib - refusal.free_gib
        moved = f"rose by {rose:.2f} GiB" if rose > 0 else "did not move"
        lines.append(
            f"free memory {refusal.free_gib:.2f} GiB before loading, {refusal.free_after_gib:.2f} GiB after the "
            f"profile run: it {moved}, though vLLM had just loaded its weights there"
        )
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.CRITICAL,
        summary=(
            "vLLM could not measure its own memory: the card's free memory did not fall while vLLM loaded and "
            "profiled, so another process released memory meanwhile, or the free count is not the device's"
        ),
        evidence=tuple(lines),
        steps=(
            "start vLLM once nothing else on the card is starting or exiting (a previous vLLM or job still "
            "releasing memory: see nvidia-smi's processes), or give vLLM a card of its own",
            "under a GPU-sharing layer (vGPU, HAMi, a device plugin that slices cards) check that the free memory "
            "it reports moves with allocations; it is that layer's count vLLM reads. No memory flag changes this",
        ),
    )
