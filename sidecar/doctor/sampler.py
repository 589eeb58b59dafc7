"""The sampler's warm-up with max_num_seqs dummy requests (or a pooling model's pooler's), out of memory. Pure.

Fewer sequences first (vLLM's own message names the flag). A lower budget only when the warm-up ran after the KV
cache was allocated: in the profile run the budget does not cap it. Before 0.21, CUDA graphs are captured after
the KV cache and outside the budget; where they took most of the room the budget leaves, `--enforce-eager` gives
the warm-up that room back.
"""

from __future__ import annotations

from sidecar.doctor import formula, remedies
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import LogFacts, OomPhase, Refusal
from sidecar.doctor.setup import Setup

SAMPLER_UTILIZATION_STEP = 0.02  # what to give up for the sampler's peak when max_num_seqs stays


def sampler_warmup(refusal: Refusal, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    dummy = refusal.dummy_requests or 0
    warmed = "pooler" if "warming up pooler" in refusal.line else "sampler"
    lines = [f"vLLM could not start: {refusal.line}", *ledger.lines()]
    recommendations: list[Recommendation] = []
    halved = remedies.fewer_sequences(
        dummy,
        "the dummy requests of the warm-up",
        f"the {warmed} warm-up runs max_num_seqs = {dummy} dummy requests at once and its "
        f"{'outputs' if warmed == 'pooler' else 'logits'} did not fit; halving it halves that peak (vLLM's own message "
        "names this flag)",
    )
    if halved is not None:
        recommendations.append(halved)
    steps: list[str] = []
    after_kv = refusal.phase in (OomPhase.WARMUP, OomPhase.AFTER_KV_CACHE)
    if refusal.phase is OomPhase.PROFILING:
        lines.append("the warm-up ran in the profile run, before the KV cache: gpu_memory_utilization does not cap it")
    elif not after_kv:
        # vLLM runs the sampler's warm-up in the profile run (no budget caps it) and again after the KV cache (the
        # budget's margin must hold it); without frames the log does not say which failed.
        steps.append(
            "if the traceback runs through compile_or_warm_up_model (after the KV cache), the budget left the warm-up "
            f"too little room: lower --gpu-memory-utilization by {SAMPLER_UTILIZATION_STEP:g} below what you set; "
            "through profile_run, the budget does not cap it and fewer sequences is the way"
        )
    elif ledger.utilization_assumed:
        steps.append(
            f"or keep max_num_seqs: lower --gpu-memory-utilization by {SAMPLER_UTILIZATION_STEP:g} below what you set "
            f"(the log does not say it; from vLLM's default {ledger.utilization:g} that is "
            f"{formula.floor_hundredths(ledger.utilization - SAMPLER_UTILIZATION_STEP):.2f})"
        )
    else:
        lowered = formula.floor_hundredths(ledger.utilization - SAMPLER_UTILIZATION_STEP)
        recommendations.append(
            Recommendation(
                flag="--gpu-memory-utilization",
                value=lowered,
                why=(
                    f"or keep max_num_seqs and leave the warm-up more room: {ledger.utilization:g} "
                    f"({ledger.utilization_source}) - {SAMPLER_UTILIZATION_STEP:g} -> {lowered:.2f} (the KV cache "
                    "shrinks by that share of the card)"
                ),
            )
        )
    eager = _graphs_took_the_margin(ledger, log) if after_kv else None
    if eager is not None:
        recommendations.append(eager)
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"vLLM ran out of memory warming up its {warmed} with {dummy} dummy requests (max_num_seqs)",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=tuple(steps),
    )


def _graphs_took_the_margin(ledger: MemoryLedger, log: LogFacts) -> Recommendation | None:
    """Before 0.21, CUDA graphs are captured after the KV cache filled the budget, outside it: where they took
    half or more of what the budget leaves the card, the warm-up after them had little room left, and running
    without them gives it back."""
    graphs, total = ledger.graphs, ledger.total
    if graphs is None or total is None or ledger.utilization_assumed or log.graphs_profiled:
        return None
    if log.args is not None and log.args.enforce_eager:
        return None
    margin = (1 - ledger.utilization) * total.value_bytes
    if margin <= 0 or graphs.value_bytes < margin / 2:
        return None
    return Recommendation(
        flag="--enforce-eager",
        value="",
        why=(
            f"or keep both and drop the CUDA graphs: captured after the KV cache, outside the budget, they took "
            f"{gib(graphs.value_bytes)} of the {gib(margin)} the budget leaves the card ({ledger.utilization:g}); "
            "without them the warm-up has that room (decoding runs slower)"
        ),
    )
