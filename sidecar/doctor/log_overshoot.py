"""Configuration overshoot read from a log: a V1 start refused for lack of free memory, or a CUDA OOM.

Says which flag to change and to what, by the phase the OOM hit: during CUDA-graph capture (lower the
utilisation by the shortfall, or run eager), during the profile run (a smaller dummy batch), or while serving
(another tenant, or vLLM beyond its budget). Pure.
"""

from __future__ import annotations

from sidecar.doctor import formula
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase, Refusal, RefusalKind
from sidecar.doctor.overshoot import ALLOC_CONF, EXPANDABLE, MIN_OVER_BUDGET_BYTES, MIN_OVER_BUDGET_RATIO
from sidecar.doctor.setup import Setup

FRAGMENTATION_BYTES = 256 * 2**20  # reserved-but-unallocated memory worth recovering with expandable segments
MIN_BATCHED_TOKENS = 256


def log_overshoot(log: LogFacts | None, setup: Setup) -> Finding | None:
    if log is None:
        return None
    if log.refusal is not None and log.refusal.kind is RefusalKind.INSUFFICIENT_FREE_MEMORY:
        return _free_memory_refusal(log.refusal)
    if log.oom is not None:
        return _oom(log.oom, setup)
    return None


def _free_memory_refusal(refusal: Refusal) -> Finding:
    free = (refusal.free_gib or 0.0) * GIB
    total = (refusal.total_gib or 0.0) * GIB
    lines = [
        f"vLLM refused to start: {refusal.line}",
        f"free at start {gib(free)} of {gib(total)}; gpu_memory_utilization {refusal.utilization:g} asks for "
        f"{refusal.requested_gib:.2f} GiB: {gib(total - free)} is held by other processes (or a previous vLLM)",
    ]
    recommendations: list[Recommendation] = []
    if total > 0:
        computed = formula.utilization(int(total), int(total - free), 0)
        recommendations.append(Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why))
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the card has less free memory than gpu_memory_utilization asks for",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _oom(oom: CudaOom, setup: Setup) -> Finding | None:
    total = oom.total_bytes
    lines = [_oom_line(oom)]
    lines.extend(f"another process on the GPU: pid {pid} holds {gib(size)}" for pid, size in oom.other_processes)
    if oom.phase is OomPhase.GRAPH_CAPTURE:
        return _graph_capture(oom, setup, lines)
    if oom.phase is OomPhase.PROFILING:
        return _profiling(oom, setup, lines)
    others = sum(size for _, size in oom.other_processes)
    utilization = setup.gpu_memory_utilization
    over = 0
    if utilization is not None and total and oom.process_bytes is not None:
        budget = int(utilization.value * total)
        lines.append(
            f"vLLM's budget: gpu_memory_utilization {utilization.value:g} ({utilization.source}) x {gib(total)} "
            f"= {gib(budget)}; its process held {gib(oom.process_bytes)}"
        )
        tolerance = max(MIN_OVER_BUDGET_BYTES, MIN_OVER_BUDGET_RATIO * total)
        over = oom.process_bytes - budget if oom.process_bytes - budget > tolerance else 0
    recommendations: list[Recommendation] = []
    if utilization is not None and total:
        computed = formula.utilization(total, others, over)
        if computed.value < utilization.value:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
    fragmented = (oom.reserved_unallocated_bytes or 0) >= FRAGMENTATION_BYTES
    if over or fragmented:
        stranded = f"{gib(oom.reserved_unallocated_bytes or 0)} was reserved by PyTorch but unallocated"
        recommendations.append(
            Recommendation(
                flag=ALLOC_CONF,
                value=EXPANDABLE,
                why=f"{stranded} when the allocation failed: expandable segments let the allocator reuse it",
            )
        )
    if not recommendations:
        return None
    cause = "another process took the memory" if others else "vLLM grew beyond its budget"
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"vLLM died of a CUDA out-of-memory error while {_phase_text(oom.phase)}: {cause}",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _graph_capture(oom: CudaOom, setup: Setup, lines: list[str]) -> Finding:
    recommendations: list[Recommendation] = []
    utilization = setup.gpu_memory_utilization
    if utilization is not None and oom.total_bytes:
        shortfall = max(0, oom.tried_bytes - (oom.free_bytes or 0))
        computed = formula.utilization_after_graph_oom(utilization.value, shortfall, oom.total_bytes)
        recommendations.append(Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why))
    recommendations.append(
        Recommendation(
            flag="--enforce-eager",
            value="",
            why="no CUDA graphs at all: their memory is freed, at the cost of slower decoding",
        )
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM ran out of memory capturing CUDA graphs: the budget leaves them no room",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _profiling(oom: CudaOom, setup: Setup, lines: list[str]) -> Finding:
    recommendations: list[Recommendation] = []
    current = setup.max_num_batched_tokens
    if current is not None:
        halved = max(MIN_BATCHED_TOKENS, current.value // 2 // MIN_BATCHED_TOKENS * MIN_BATCHED_TOKENS)
        if halved < current.value:
            recommendations.append(
                Recommendation(
                    flag="--max-num-batched-tokens",
                    value=halved,
                    why=f"the profile run's dummy batch is max_num_batched_tokens long: {current.value} "
                    f"({current.source}) halved, rounded down to a multiple of {MIN_BATCHED_TOKENS} -> {halved}",
                )
            )
    others = sum(size for _, size in oom.other_processes)
    utilization = setup.gpu_memory_utilization
    if others and utilization is not None and oom.total_bytes:
        computed = formula.utilization(oom.total_bytes, others, 0)
        if computed.value < utilization.value:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
    if not recommendations:
        lines.append("max_num_batched_tokens unknown (no arguments in the log): cannot size the profile batch")
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM ran out of memory in its profile run, before the KV cache was sized",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _oom_line(oom: CudaOom) -> str:
    parts = [f"CUDA out of memory while {_phase_text(oom.phase)}: tried to allocate {gib(oom.tried_bytes)}"]
    if oom.total_bytes is not None and oom.free_bytes is not None:
        parts.append(
            f"GPU {oom.gpu if oom.gpu is not None else '?'} had {gib(oom.free_bytes)} free of {gib(oom.total_bytes)}"
        )
    if oom.process_bytes is not None:
        parts.append(f"vLLM's process held {gib(oom.process_bytes)}")
    if oom.reserved_unallocated_bytes is not None:
        parts.append(f"{gib(oom.reserved_unallocated_bytes)} reserved by PyTorch but unallocated")
    return "; ".join(parts)


def _phase_text(phase: OomPhase) -> str:
    return {
        OomPhase.PROFILING: "profiling memory at start",
        OomPhase.GRAPH_CAPTURE: "capturing CUDA graphs at start",
        OomPhase.SERVING: "serving",
        OomPhase.UNKNOWN: "running",
    }[phase]
