"""The CPU backend's KV cache, which lives in the host memory of one NUMA node. Pure.

vLLM's CPU worker (v1/worker/cpu_worker.py, read in 0.32) takes the KV space either as set
(`VLLM_CPU_KVCACHE_SPACE` in whole GiB, or `--kv-cache-memory-bytes`), logging "Explicitly set (S/T) GiB for KV
cache on node N.", or sized from --gpu-memory-utilization of the node's memory ("Auto set ..."). An explicit
space is not sized by the budget: when it leaves no KV cache, raising --gpu-memory-utilization (which vLLM's own
message suggests) changes nothing; the space must grow. Before vLLM sized it from the budget, the CPU backend's
default was 4 GiB ("VLLM_CPU_KVCACHE_SPACE ... not set, using 4 by default").
"""

from __future__ import annotations

import math

from sidecar.doctor import formula, remedies
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.logfacts import CpuKvSpace, Refusal

DEFAULT_SPACE_GIB = 4  # the CPU backend's KV space when VLLM_CPU_KVCACHE_SPACE was unset, before 0.11
NODE_SHARE = 0.5  # an explicit KV space at most half the node: the weights and the activations need the rest


def explicit_space_short(space: CpuKvSpace, lines: list[str]) -> Finding:
    """The KV space was set explicitly and holds no block: a larger space, within the node."""
    ceiling = math.floor(space.node_total_gib * NODE_SHARE)
    wanted = max(DEFAULT_SPACE_GIB, 2 * math.ceil(space.space_gib))
    value = min(wanted, ceiling)
    evidence = [
        *lines,
        f"the KV space is set explicitly: {space.line} (VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes); "
        "--gpu-memory-utilization does not size an explicit space, so raising it changes nothing",
    ]
    recommendations: list[Recommendation] = []
    if value > space.space_gib:
        basis = (
            f"the CPU backend's own default of {DEFAULT_SPACE_GIB} GiB"
            if wanted == DEFAULT_SPACE_GIB
            else f"twice today's {space.space_gib:g} GiB"
        )
        capped = f", capped at half the node's {space.node_total_gib:g} GiB" if value < wanted else ""
        recommendations.append(
            Recommendation(
                flag="VLLM_CPU_KVCACHE_SPACE",
                value=value,
                why=f"{basis}{capped} -> {value} (whole GiB; or unset it to size the space from the budget)",
            )
        )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"vLLM could not start: its KV space is set to {space.space_gib:g} GiB, too little for one KV block",
        evidence=tuple(evidence),
        recommendations=tuple(recommendations),
        steps=()
        if recommendations
        else (f"the node's {space.node_total_gib:g} GiB cannot give the KV space more: a host with more memory",),
    )


def space_for_length(space: CpuKvSpace, wanted: int, fits: int) -> Recommendation | None:
    """An explicit KV space that holds `fits` tokens of a `wanted` max_model_len, grown in proportion (whole GiB),
    while it stays within half the node; None past that, or when today's space is not stated above 0."""
    if space.space_gib <= 0 or fits <= 0:
        return None
    value = math.ceil(space.space_gib * wanted / fits)
    if value > space.node_total_gib * NODE_SHARE:
        return None
    return Recommendation(
        flag="VLLM_CPU_KVCACHE_SPACE",
        value=value,
        why=(
            f"or keep max_model_len: the space set today, {space.space_gib:g} GiB x {wanted:,} / {fits:,} tokens, "
            f"rounded up to whole GiB -> {value} (within half the node's {space.node_total_gib:g} GiB)"
        ),
    )


def cpu_kv_refusal(refusal: Refusal) -> Finding:
    """The CPU backend asked the NUMA node for a KV cache larger than what it has available: the KV space must fit
    in it (VLLM_CPU_KVCACHE_SPACE, whole GiB), or the budget that sizes it must shrink by the difference."""
    available = refusal.free_gib or 0.0
    total = refusal.total_gib or 0.0
    requested = refusal.requested_gib or 0.0
    budget = refusal.budget_gib or requested
    space = math.floor(available * (1 - formula.RESERVE_RATIO))
    lines = [
        f"vLLM refused to start: {refusal.line}",
        f"the KV cache asked for {requested:.2f} GiB of a {budget:.2f} GiB budget; the node has {available:.2f} "
        f"of {total:.2f} GiB available",
    ]
    recommendations = [
        Recommendation(
            flag="VLLM_CPU_KVCACHE_SPACE",
            value=space,
            why=f"{available:.2f} GiB available less the {formula.RESERVE_RATIO:.0%} reserve, in whole GiB -> {space}",
        )
    ]
    if total > 0:
        fits = formula.floor_hundredths((available + budget - requested) / total - 0.01)
        if fits >= remedies.MIN_USEFUL_UTILIZATION / 10:
            recommendations.append(
                Recommendation(
                    flag="--gpu-memory-utilization",
                    value=fits,
                    why=(
                        f"or the budget, which on the CPU backend sizes host memory: ({available:.2f} available + "
                        f"{budget - requested:.2f} the budget holds besides the KV cache) / {total:.2f} GiB - 0.01 "
                        f"-> {fits:.2f}"
                    ),
                )
            )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: its KV cache asks the CPU's memory node for more than it has available",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )
