"""A transient after the KV cache took the budget (graph capture, a kernel's or the sampler's warm-up,
serving): give it the room it lacked (a lower budget by its shortfall, said as a step where the log does not state
the budget), or make it smaller (fewer or no CUDA graphs, fewer sequences, fewer batched tokens). Pure.
"""

from __future__ import annotations

from sidecar.doctor import formula, remedies
from sidecar.doctor.capture_sizes import fewer_or_no_graphs
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase
from sidecar.doctor.phase import RAN_OUT, phase_text
from sidecar.doctor.remedies import sequences
from sidecar.doctor.setup import Setup

BEFORE_KV_SHARE = 0.8  # vLLM's process under this share of its budget had not allocated its KV cache yet
# Over the default budget by more than this share of the card (and these bytes), vLLM's process had a budget set
# higher: what a V0 process holds outside its budget (CUDA graphs, NCCL, the context) stays within a few GiB.
OVER_DEFAULT_SHARE = 0.05
OVER_DEFAULT_BYTES = 3 * 2**30
_SMALL_CARD_BYTES = 16 * 2**30  # where the log does not state the card: a small one, so the step is never too short


def held_under_budget(oom: CudaOom, ledger: MemoryLedger) -> int | None:
    """What vLLM's process held at the error, when that is under BEFORE_KV_SHARE of its budget; else None."""
    budget = ledger.budget_bytes
    held = oom.held_bytes
    if not budget or held is None or held >= BEFORE_KV_SHARE * budget:
        return None
    return held


def after_kv(
    oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, setup: Setup, *, log: LogFacts, lines: list[str]
) -> Finding:
    """A transient after the KV cache took the budget: give it the room it lacked, or make it smaller."""
    recommendations: list[Recommendation] = []
    steps: list[str] = []
    if oom.tried_bytes is not None and oom.free_bytes is not None:
        lowered = remedies.lower_budget_for_transient(ledger, oom.tried_bytes, oom.free_bytes)
        if lowered is not None and not ledger.utilization_assumed:
            recommendations.append(lowered)
        elif lowered is not None and ledger.total is not None:
            step = (oom.shortfall_bytes or 0) / ledger.total.value_bytes + formula.GRAPH_MARGIN_RATIO
            steps.append(
                _unless_before_kv(oom, phase, ledger, step)
                or f"lower --gpu-memory-utilization by {step:.3f} below what you set (the log does not say it; "
                + (
                    _above_the_default(oom, ledger)
                    or f"from vLLM's default {ledger.utilization:g} that is {lowered.value}"
                )
                + "): "
                + _lacked(oom, ledger.total.value_bytes)
            )
    recommendations += _graph_remedies(oom, phase, setup, log=log, lines=lines)
    if phase is OomPhase.WARMUP:
        fewer_seqs = sequences(setup, log, "the sampler's warm-up runs max_num_seqs dummy requests")
        if fewer_seqs is not None:
            recommendations.append(fewer_seqs)
    if phase is OomPhase.SERVING:
        batched = remedies.fewer_batched_tokens(setup, "or shrink the peak: a step's activations grow with its tokens")
        if (
            batched is not None
            and setup.max_num_batched_tokens is not None
            and setup.max_num_batched_tokens.value > 2048
        ):
            recommendations.append(batched)
    if not recommendations and not steps and oom.shortfall_bytes is not None and ledger.total is None:
        steps.append(
            f"the transient lacked {gib(oom.shortfall_bytes)} and the log does not state the card's memory: lower "
            "--gpu-memory-utilization below what you set by that share of the card plus a hundredth "
            f"({oom.shortfall_bytes / _SMALL_CARD_BYTES + 0.01:.3f} on a 16 GiB card, less on a larger one)"
        )
    if not recommendations and not steps:
        steps.append(
            "the log states neither the allocation nor the card: lower --gpu-memory-utilization a few hundredths "
            "below what you set, or find PyTorch's 'Tried to allocate ... of which ... is free' line to size it"
        )
    cause_text = "a transient the budget did not leave room for"
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{RAN_OUT} while {phase_text(phase)}: {cause_text}",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=tuple(steps),
    )


def _lacked(oom: CudaOom, total_bytes: float) -> str:
    shortfall, card = oom.shortfall_bytes or 0, gib(total_bytes)
    if shortfall < 0.01 * GIB and oom.tried_bytes is not None:
        # Free memory a hair under the request: "lacked 0.00 GiB" would read as no shortage at all.
        asked, free = gib(oom.tried_bytes), gib(oom.free_bytes or 0)
        return f"the {card} card was full: the transient asked for {asked} with {free} free"
    return f"the transient lacked {gib(shortfall)} of {card}"


def _above_the_default(oom: CudaOom, ledger: MemoryLedger) -> str | None:
    """With the budget assumed, a process holding well over what vLLM's default gives it says the budget was set
    higher: a value stepped down from the default would be below it by more than the transient needs. What the
    process held bounds the budget set from above (what it holds beyond the budget is unknown here)."""
    held, total, budget = oom.held_bytes, ledger.total, ledger.budget_bytes
    if held is None or total is None or not budget:
        return None
    if held <= budget + max(OVER_DEFAULT_SHARE * total.value_bytes, OVER_DEFAULT_BYTES):
        return None
    share = held / total.value_bytes
    return (
        f"vLLM's process held {gib(held)}, {share:.0%} of the card, more than vLLM's default "
        f"{ledger.utilization:g} gives it: it was set higher, at most about {share:.2f}"
    )


def _unless_before_kv(oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, step: float) -> str | None:
    """A lower budget helps a transient only once the KV cache fills the budget. With the budget assumed and
    vLLM's process far under it, the log does not say which held: a budget set that low, or a KV cache not yet
    allocated (the profile run's dummy batch, which no budget caps). The step that says both, or None."""
    held, total = held_under_budget(oom, ledger), ledger.total
    if phase is not OomPhase.UNKNOWN or held is None or total is None:
        return None
    share = held / total.value_bytes
    return (
        f"vLLM's process held {gib(held)} ({share:.0%} of the card), far under the budget assumed from vLLM's "
        f"default {ledger.utilization:g}: the KV cache, which fills the budget, was probably not allocated yet, so a "
        "lower budget frees nothing; the profile run's dummy batch is the likelier demand (halve --max-num-seqs or "
        f"--max-num-batched-tokens). If you set --gpu-memory-utilization near {share:.2f}, lower it by {step:.3f} "
        f"instead (the transient lacked {gib(oom.shortfall_bytes or 0)}). The engine's config line "
        "(gpu_memory_utilization=...) settles which"
    )


def _graph_remedies(
    oom: CudaOom, phase: OomPhase, setup: Setup, *, log: LogFacts, lines: list[str]
) -> list[Recommendation]:
    """Fewer or no CUDA graphs, where graphs exist or are being captured. (What "allocated in private pools"
    says is no measure of what no graphs would free: the corpus has logs where it reads 0.04-0.07 GiB under
    graphs of 2.65 GiB, and no graphs was the fix.)"""
    if phase not in (OomPhase.GRAPH_CAPTURE, OomPhase.WARMUP, OomPhase.AFTER_KV_CACHE) or _kernel_warmup(oom):
        return []
    return fewer_or_no_graphs(
        setup,
        log,
        lines,
        eager_why="or no CUDA graphs at all: their memory is freed, at the cost of slower decoding",
        fewer=phase is not OomPhase.AFTER_KV_CACHE,
    )


# Kernel warm-ups (DeepGEMM's JIT, FlashInfer's autotuner) run before vLLM captures its CUDA graphs
# (gpu_worker.compile_or_warm_up_model: kernel_warmup, then capture_model, in vLLM 0.32): no graph exists yet, so
# neither --enforce-eager nor fewer capture sizes frees anything for them.
_KERNEL_WARMUP = ("deep_gemm_warmup", "kernel_warmup", "flashinfer_autotune", "autotune")


def _kernel_warmup(oom: CudaOom) -> bool:
    return oom.phase is OomPhase.WARMUP and any(name in oom.phase_evidence for name in _KERNEL_WARMUP)
