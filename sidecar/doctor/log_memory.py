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

from sidecar.doctor import remedies
from sidecar.doctor.cpu_kv import cpu_kv_refusal
from sidecar.doctor.cut_traceback import cut_traceback
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib, tokens
from sidecar.doctor.graph_estimate import NEGATIVE_ESTIMATE_GIB, negative_graph_estimate
from sidecar.doctor.graph_profile import graph_profiling
from sidecar.doctor.host_memory import host_memory_finding
from sidecar.doctor.kv_room import no_kv_room
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.ledger_entries import build_ledger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase, Refusal, RefusalKind
from sidecar.doctor.oom_readings import not_the_budget, weights_do_not_fit
from sidecar.doctor.phase import RAN_OUT, phase_text
from sidecar.doctor.remedies import sequences
from sidecar.doctor.sampler import sampler_warmup
from sidecar.doctor.setup import Setup
from sidecar.doctor.start_checks import external_weights, free_memory_refusal, profile_check
from sidecar.doctor.start_readings import kv_refusal, prompt_over_kv, state_blocks
from sidecar.doctor.state_reserve import state_reserve
from sidecar.doctor.stranded import stranded, stranded_line, stranded_why
from sidecar.doctor.transient import BEFORE_KV_SHARE, after_kv, held_under_budget


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
        if finding is None and log.cut_in is not None:
            finding = cut_traceback(log.cut_in, ledger, setup, log)
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
        RefusalKind.EXTERNAL_WEIGHTS: lambda: external_weights(refusal),
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
    if phase is OomPhase.GRAPH_PROFILING:
        if ledger.weights_fit() is False:
            return weights_do_not_fit(oom, ledger, setup, lines)
        return graph_profiling(setup, log, lines)
    if stranded(oom) and phase is not OomPhase.GRAPH_CAPTURE:  # graphs allocate from private pools of their own
        return _finding(
            Cause.ALLOCATOR_FRAGMENTATION,
            f"{RAN_OUT} while {phase_text(phase)}: PyTorch's allocator stranded the memory it needed",
            [*lines, stranded_line(oom)],
            [remedies.expandable_segments(stranded_why(oom), oom.device)],
        )
    return after_kv(oom, phase, ledger, setup, log=log, lines=lines)


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
    held = held_under_budget(oom, ledger)
    if held is not None and not ledger.utilization_assumed:
        return OomPhase.PROFILING, (
            f"vLLM's process held {gib(held)}, under {BEFORE_KV_SHARE:.0%} of its {gib(ledger.budget_bytes or 0)} "
            "budget: the KV cache, which fills the budget, was not allocated yet"
        )
    return OomPhase.UNKNOWN, oom.phase_evidence


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
