"""Why vLLM ran out of memory, read from its log: one finding for the crash or refused start. Pure.

The reading follows the memory ledger of the GPU the error hit (`ledger`) and the phase the traceback shows
(`phase`), not the message's wording, so a message a new release words differently in a known phase is still
read, and the direction of every recommendation follows from which amount overflowed:

* the weights do not fit what the card gives vLLM -> `does_not_fit`: more GPUs, fewer bytes per weight;
  never a lower `--gpu-memory-utilization` (the budget does not cap weight loading);
* the weights fit, but the budget leaves no KV cache -> a larger budget within what is free, fewer sequences,
  fewer batched tokens (`start_readings`);
* another process holds memory -> a budget within what it leaves;
* a transient after the KV cache (graph capture, warm-up, serving) -> a lower budget by its shortfall, fewer
  graphs, eager mode, or the allocator's expandable segments when the memory was stranded;
* a transient before the KV cache (the profile run) -> a smaller dummy batch, never a lower budget.

Where the ledger does not decide a direction, the finding says what is unknown and which line settles it, and
recommends nothing it would have to guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sidecar.doctor import formula, remedies
from sidecar.doctor.capture_sizes import fewer_graphs
from sidecar.doctor.cpu_kv import cpu_kv_refusal
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib, tokens
from sidecar.doctor.graph_estimate import NEGATIVE_ESTIMATE_GIB, negative_graph_estimate
from sidecar.doctor.host_memory import host_memory_finding
from sidecar.doctor.kv_room import no_kv_room
from sidecar.doctor.ledger import MemoryLedger, build_ledger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase, Refusal, RefusalKind
from sidecar.doctor.oom_readings import (
    not_the_budget,
    stranded,
    stranded_line,
    stranded_why,
    weights_do_not_fit,
)
from sidecar.doctor.phase import RAN_OUT, phase_text
from sidecar.doctor.remedies import sequences
from sidecar.doctor.sampler import sampler_warmup
from sidecar.doctor.setup import Setup
from sidecar.doctor.start_readings import (
    free_memory_refusal,
    kv_refusal,
    profile_check,
    prompt_over_kv,
    state_blocks,
)
from sidecar.doctor.state_reserve import state_reserve

BEFORE_KV_SHARE = 0.8  # vLLM's process under this share of its budget had not allocated its KV cache yet
_SMALL_CARD_BYTES = 16 * 2**30  # where the log does not state the card: a small one, so the step is never too short


def log_memory(evidence: Evidence, setup: Setup) -> Finding | None:
    log = evidence.log
    if log is None:
        return None
    ledger = build_ledger(log, setup)
    refusal = log.refusal
    finding: Finding | None = None
    estimate = log.graph_estimate_gib
    if estimate is not None and estimate < NEGATIVE_ESTIMATE_GIB and refusal is None:
        # The root cause of whatever followed: an OOM after it is the cache it oversized.
        also = (f"then: {log.oom.message}",) if log.oom is not None and log.oom.message else ()
        finding = negative_graph_estimate(estimate, ledger, also)
    elif refusal is not None:
        finding = _refusal(refusal, ledger, setup, log)
    elif log.oom is not None:
        finding = _oom(log.oom, ledger, setup, log)
    elif log.host_memory is not None:
        finding = host_memory_finding(log.host_memory, log)
    elif log.num_gpu_blocks == 0 or (ledger.kv is not None and ledger.kv.value_bytes <= 0):
        finding = no_kv_room(None, ledger, setup, log)
    else:
        finding = _inferred_kv_refusal(ledger, setup, log)
        if finding is None and log.cut_in is OomPhase.PROFILING:
            finding = _cut_in_profile_run(ledger, setup, log)
    if finding is not None and log.engine_dead:
        finding = _died(finding)
    return finding


def _refusal(refusal: Refusal, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    """The reading of each refusal vLLM words, by its kind; the KV cache's refusals are the rest."""
    readers: dict[RefusalKind, Callable[[], Finding | None]] = {
        RefusalKind.INSUFFICIENT_FREE_MEMORY: lambda: free_memory_refusal(refusal, ledger),
        RefusalKind.SAMPLER_WARMUP: lambda: sampler_warmup(refusal, ledger, setup, log),
        RefusalKind.CPU_KV_OVER_AVAILABLE: lambda: cpu_kv_refusal(refusal),
        RefusalKind.PROFILE_FREE_DID_NOT_FALL: lambda: profile_check(refusal),
        RefusalKind.PROMPT_OVER_KV: lambda: prompt_over_kv(refusal, ledger, setup),
        RefusalKind.STATE_BLOCKS: lambda: state_blocks(refusal),
    }
    reader = readers.get(refusal.kind)
    if reader is not None:
        return reader()
    finding = (
        state_reserve(refusal, ledger, setup)
        or kv_refusal(refusal, ledger, setup, log)
        or no_kv_room(refusal.line, ledger, setup, log)
    )
    return _budget_knob(finding, refusal.budget_env)


def _budget_knob(finding: Finding, variable: str | None) -> Finding:
    """A plugin that reads its budget from its own environment variable is told that variable's value."""
    if variable is None:
        return finding
    said = f"{variable} is the budget this plugin reads (its refusal names it), in place of --gpu-memory-utilization"
    renamed = tuple(
        replace(r, flag=variable, why=f"{r.why}; {said}") if r.flag == "--gpu-memory-utilization" else r
        for r in finding.recommendations
    )
    return replace(finding, recommendations=renamed)


def _inferred_kv_refusal(ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    """vLLM refuses to start when one max_model_len request does not fit the KV cache it sized; a log cut before
    the refusal's text still shows the KV cache's size (`# GPU blocks`) and either max_model_len above it or a
    traceback through the check itself."""
    limit = setup.max_model_len
    if log.kv_check_failed and log.traceback and ledger.kv_tokens is None and ledger.kv is None:
        return _kv_check_cut(ledger, setup)
    if ledger.kv_tokens is None or ledger.kv_tokens <= 0 or not log.traceback:
        return None
    too_long = limit is not None and ledger.kv_tokens < limit.value
    if not (too_long or log.kv_check_failed):
        return None
    return kv_refusal(None, ledger, setup, log)


def _kv_check_cut(ledger: MemoryLedger, setup: Setup) -> Finding:
    """A traceback through vLLM's check that the KV cache holds one max_model_len request, its error cut off and
    no size in the log: the check raises either that no block is left or that max_model_len is too long. The
    log says neither which nor by how much; both want a KV cache no smaller than today's."""
    said = f" ({tokens(setup.max_model_len.value)} tokens, {setup.max_model_len.source})" if setup.max_model_len else ""
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary="vLLM refused to start at its KV-cache check; the error itself is cut from the log",
        evidence=(
            "the traceback runs through vLLM's check that its KV cache holds one request of max_model_len"
            f"{said}, and the log ends before the error says which of its two refusals it raised",
            *ledger.lines(),
        ),
        steps=(
            "find the error at the traceback's end: 'max seq len (M) is larger than the maximum number of tokens "
            "that can be stored in KV cache (C)' (or '... KV cache is needed, which is larger than the available "
            "KV cache memory'): set --max-model-len at most C, or give the KV cache more memory; 'No available "
            "memory for the cache blocks': a larger --gpu-memory-utilization where the card has room; in both, a "
            "lower budget makes it worse",
        ),
    )


def _cut_in_profile_run(ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    """The log ends inside a traceback through the profile run, its error line cut: most often the dummy batch
    ran out of memory, but the log does not say so. What to look for, and the first step if it did."""
    halved = sequences(setup, log, "the profile run runs max_num_seqs dummy requests")
    first = (
        f"set --max-num-seqs {halved.value} ({halved.why})"
        if halved is not None
        else "halve --max-num-seqs (the profile run runs that many dummy requests)"
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.WARNING,
        summary="vLLM failed in its profile run, before the KV cache; the error itself is cut from the log",
        evidence=(
            "the log ends inside a traceback through the profile run (the dummy batch that sizes the KV cache), "
            "before the error line",
            *ledger.lines(),
        ),
        steps=(
            "find the error line at the traceback's end: if it is CUDA out of memory, the dummy batch did not fit "
            f"beside the weights, and gpu_memory_utilization does not cap it: {first}; with a multimodal model, "
            "fewer or smaller images per prompt (--limit-mm-per-prompt) shrink it too",
        ),
    )


def _died(finding: Finding) -> Finding:
    summary = finding.summary.replace(RAN_OUT, "vLLM died of an out-of-memory error", 1)
    if "died" not in summary:
        summary = f"{summary}; vLLM's engine died of it"
    return replace(
        finding,
        summary=summary,
        evidence=(
            *finding.evidence,
            "the engine died of this error: the log then says the engine is dead (EngineDeadError or 'Engine core "
            "proc ... died'): every request in flight failed and vLLM had to be restarted",
        ),
    )


def _oom(oom: CudaOom, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    phase, placed = _placed(oom, ledger)
    lines = [_oom_line(oom, phase), f"where: {placed}", *ledger.lines()]
    elsewhere = not_the_budget(oom, phase, ledger, setup, log=log, lines=lines)
    if elsewhere is not None:
        return elsewhere
    if phase is OomPhase.PROFILING:  # the dummy batch is the configuration's choice, stranded memory or not
        return _before_kv(oom, ledger, setup, log, lines)
    if stranded(oom) and phase is not OomPhase.GRAPH_CAPTURE:  # graphs allocate from private pools of their own
        return _finding(
            Cause.ALLOCATOR_FRAGMENTATION,
            f"{RAN_OUT} while {phase_text(phase)}: PyTorch's allocator stranded the memory it needed",
            [*lines, stranded_line(oom)],
            [remedies.expandable_segments(stranded_why(oom), oom.device)],
        )
    return _after_kv(oom, phase, ledger, setup, log=log, lines=lines)


def _placed(oom: CudaOom, ledger: MemoryLedger) -> tuple[OomPhase, str]:
    """The phase the traceback or the progress lines show; else what the ledger says: graphs in PyTorch's private
    pools mean the capture had begun; vLLM's process far under its budget had not allocated its KV cache."""
    if oom.phase is not OomPhase.UNKNOWN:
        return oom.phase, oom.phase_evidence
    if oom.private_pool_bytes:
        return OomPhase.AFTER_KV_CACHE, (
            f"{gib(oom.private_pool_bytes)} allocated in PyTorch's private pools: CUDA graphs exist, which vLLM "
            "captures after allocating its KV cache"
        )
    held = _held_under_budget(oom, ledger)
    if held is not None and not ledger.utilization_assumed:
        return OomPhase.PROFILING, (
            f"vLLM's process held {gib(held)}, under {BEFORE_KV_SHARE:.0%} of its {gib(ledger.budget_bytes or 0)} "
            "budget: the KV cache, which fills the budget, was not allocated yet"
        )
    return OomPhase.UNKNOWN, oom.phase_evidence


def _held_under_budget(oom: CudaOom, ledger: MemoryLedger) -> int | None:
    """What vLLM's process held at the error, when that is under BEFORE_KV_SHARE of its budget; else None."""
    budget = ledger.budget_bytes
    held = oom.process_bytes or oom.allocated_bytes
    if not budget or held is None or held >= BEFORE_KV_SHARE * budget:
        return None
    return held


def _before_kv(oom: CudaOom, ledger: MemoryLedger, setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    """The profile run's dummy batch did not fit beside the weights: the budget does not cap it. Fewer sequences
    and batched tokens come first (the dummy batch is theirs); stranded memory adds expandable segments."""
    if ledger.weights_fit() is False:
        return weights_do_not_fit(oom, ledger, setup, lines)
    recommendations = [
        r
        for r in (
            remedies.fewer_batched_tokens(setup, "the profile run's dummy batch is max_num_batched_tokens long"),
            sequences(setup, log, "the profile run and its sampler run max_num_seqs dummy requests"),
        )
        if r is not None
    ]
    if stranded(oom):
        lines.append(stranded_line(oom))
        recommendations.append(
            remedies.expandable_segments(f"and, as the memory was stranded: {stranded_why(oom)}", oom.device)
        )
    lines.append("gpu_memory_utilization does not cap the profile run (it sizes the KV cache after it)")
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM ran out of memory in its profile run, before the KV cache: the dummy batch does not fit",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=()
        if recommendations
        else ("the log shows neither max_num_batched_tokens nor max_num_seqs: halve whichever you set",),
    )


def _after_kv(
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
                or f"lower --gpu-memory-utilization by {step:.3f} below what you set (the log does not say it; from "
                f"vLLM's default {ledger.utilization:g} that is {lowered.value}): "
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


def _unless_before_kv(oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, step: float) -> str | None:
    """A lower budget helps a transient only once the KV cache fills the budget. With the budget assumed and
    vLLM's process far under it, the log does not say which held: a budget set that low, or a KV cache not yet
    allocated (the profile run's dummy batch, which no budget caps). The step that says both, or None."""
    held, total = _held_under_budget(oom, ledger), ledger.total
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
    found: list[Recommendation] = []
    if phase not in (OomPhase.GRAPH_CAPTURE, OomPhase.WARMUP, OomPhase.AFTER_KV_CACHE) or _kernel_warmup(oom):
        return found
    if phase is not OomPhase.AFTER_KV_CACHE:
        fewer = fewer_graphs(setup, log, lines)
        if fewer is not None:
            found.append(fewer)
    if not (log.args is not None and log.args.enforce_eager):
        found.append(
            Recommendation(
                flag="--enforce-eager",
                value="",
                why="or no CUDA graphs at all: their memory is freed, at the cost of slower decoding",
            )
        )
    return found


# Kernel warm-ups (DeepGEMM's JIT, FlashInfer's autotuner) run before vLLM captures its CUDA graphs
# (gpu_worker.compile_or_warm_up_model: kernel_warmup, then capture_model, in vLLM 0.32): no graph exists yet, so
# neither --enforce-eager nor fewer capture sizes frees anything for them.
_KERNEL_WARMUP = ("deep_gemm_warmup", "kernel_warmup", "flashinfer_autotune", "autotune")


def _kernel_warmup(oom: CudaOom) -> bool:
    return oom.phase is OomPhase.WARMUP and any(name in oom.phase_evidence for name in _KERNEL_WARMUP)


def _finding(cause: Cause, summary: str, lines: list[str], recommendations: list[Recommendation]) -> Finding:
    return Finding(
        cause=cause,
        severity=Severity.CRITICAL,
        summary=summary,
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _oom_line(oom: CudaOom, phase: OomPhase) -> str:
    parts = [f"{oom.device} out of memory while {phase_text(phase)}"]
    if oom.tried_bytes is not None:
        parts[0] += f": tried to allocate {gib(oom.tried_bytes)}"
    if oom.total_bytes is not None and oom.free_bytes is not None:
        parts.append(
            f"GPU {oom.gpu if oom.gpu is not None else '?'} had {gib(oom.free_bytes)} free of {gib(oom.total_bytes)}"
        )
    elif oom.free_bytes is not None:
        parts.append(f"{gib(oom.free_bytes)} free (the card's size is not in the message)")
    if oom.allocated_bytes is not None:
        parts.append(f"PyTorch had allocated {gib(oom.allocated_bytes)}")
    if oom.tried_bytes is None:
        parts.append(f"no sizes in the message: {oom.message[:200]}")
    return "; ".join(parts)
