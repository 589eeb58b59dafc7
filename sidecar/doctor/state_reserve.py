"""A hybrid model's per-sequence state, reserved beside the KV cache for max_num_seqs sequences. Pure.

A model with linear attention (Gated DeltaNet, Mamba) keeps a fixed state per running sequence. vllm-metal
reserves it out of the KV budget for every sequence max_num_seqs allows, and says so in its refusal (or leaves it
as what its breakdown does not add up to). Where the budget holds the weights and overhead with room left, that
reserve is what took the KV cache: fewer sequences give it back, without a larger budget.
"""

from __future__ import annotations

from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import Refusal
from sidecar.doctor.setup import V0_MAX_NUM_SEQS, Setup

STATE_SHARE = 0.5  # the reserve may take at most half of what the weights leave: the rest is the KV cache's


def state_reserve(refusal: Refusal, ledger: MemoryLedger, setup: Setup) -> Finding | None:
    """Fewer sequences where the state reserve, not the weights, took the budget; None where the budget is short
    before the reserve (a larger budget first: `no_kv_room`)."""
    reserve = refusal.state_reserve_gib
    budget, weights, overhead, kv = ledger.budget_bytes, ledger.weights, ledger.non_torch, ledger.kv
    if reserve is None or budget is None or weights is None or kv is None:
        return None
    room = budget - weights.value_bytes - (overhead.value_bytes if overhead is not None else 0.0)
    if room <= 0:
        return None
    seqs, source = _sequences(refusal, setup)
    per_sequence = reserve * 1024**3 / seqs
    fitting = int(STATE_SHARE * room // per_sequence)
    value = 1 << (fitting.bit_length() - 1) if fitting >= 1 else 1
    if value >= seqs:
        return None
    lines = [f"vLLM refused to start: {refusal.line}", *ledger.lines()]
    lines.append(
        f"the weights and overhead leave {gib(room)} of the budget; the per-sequence state reserved for {seqs} "
        f"sequences ({source}) takes {gib(reserve * 1024**3)} of it, {gib(per_sequence)} a sequence"
    )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the state reserved for max_num_seqs sequences took the KV cache's budget",
        evidence=tuple(lines),
        recommendations=(
            Recommendation(
                flag="--max-num-seqs",
                value=value,
                why=(
                    f"{STATE_SHARE:.0%} of the {gib(room)} the weights leave / {gib(per_sequence)} of state a sequence "
                    f"= {fitting}, the power of two at or below -> {value}: the other half is the KV cache's"
                ),
            ),
        ),
        steps=("or keep the sequences and raise the budget by what the reserve took (within what the device has)",),
    )


def _sequences(refusal: Refusal, setup: Setup) -> tuple[int, str]:
    if refusal.max_num_seqs is not None:
        return refusal.max_num_seqs, "the refusal's"
    if setup.max_num_seqs is not None:
        return setup.max_num_seqs.value, setup.max_num_seqs.source
    return V0_MAX_NUM_SEQS, f"vLLM's default {V0_MAX_NUM_SEQS} on a device under 70 GiB, assumed"
