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

from dataclasses import replace

from sidecar.doctor import formula, remedies
from sidecar.doctor.capture_sizes import fewer_graphs
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.ledger import MemoryLedger, build_ledger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase, RefusalKind
from sidecar.doctor.overshoot import MIN_STRANDED_BYTES
from sidecar.doctor.setup import Setup
from sidecar.doctor.start_readings import free_memory_refusal, kv_refusal, no_kv_room, sampler_warmup, sequences

_RAN_OUT = "vLLM ran out of memory"
BEYOND_ANY_BUDGET = 0.97  # PyTorch holding this share of the card: no budget vLLM sets allows it after the KV cache
BEFORE_KV_SHARE = 0.8  # vLLM's process under this share of its budget had not allocated its KV cache yet
MIN_SLACK_BYTES = 64 * 2**20  # stranded memory under this is the caching allocator's ordinary slack
STRANDED_MARGIN = 4  # a small shortfall is fragmentation when the stranded memory holds it this many times
NOT_SHORT_FREE_SHARE = 0.1  # free at the error at least this share of the card (and twice the ask): no shortage
MAX_TRANSIENT_SHARE = 0.2  # a shortfall beyond this share of the card is no transient a budget makes room for
_PHASE_TEXT = {
    OomPhase.WEIGHT_LOADING: "loading the model's weights",
    OomPhase.PROFILING: "profiling memory at start (before the KV cache)",
    OomPhase.KV_ALLOCATION: "allocating the KV cache",
    OomPhase.WARMUP: "warming up after the KV cache was allocated",
    OomPhase.GRAPH_CAPTURE: "capturing CUDA graphs at start",
    OomPhase.SERVING: "serving",
    OomPhase.WAKE_UP: "waking up from sleep mode",
    OomPhase.AFTER_KV_CACHE: "capturing CUDA graphs or serving (after the KV cache was allocated)",
    OomPhase.UNKNOWN: "running",
}


def log_memory(evidence: Evidence, setup: Setup) -> Finding | None:
    log = evidence.log
    if log is None:
        return None
    ledger = build_ledger(log, setup)
    refusal = log.refusal
    finding: Finding | None = None
    if refusal is not None and refusal.kind is RefusalKind.INSUFFICIENT_FREE_MEMORY:
        finding = free_memory_refusal(refusal)
    elif refusal is not None and refusal.kind is RefusalKind.SAMPLER_WARMUP:
        finding = sampler_warmup(refusal, ledger, setup, log)
    elif refusal is not None and refusal.kind in (RefusalKind.MAX_LEN_EXCEEDS_KV, RefusalKind.NO_CACHE_MEMORY):
        finding = kv_refusal(refusal, ledger, setup, log) or no_kv_room(refusal.line, ledger, setup, log)
    elif log.oom is not None:
        finding = _oom(log.oom, ledger, setup, log)
    elif log.num_gpu_blocks == 0 or (ledger.kv is not None and ledger.kv.value_bytes <= 0):
        finding = no_kv_room(None, ledger, setup, log)
    else:
        finding = _inferred_kv_refusal(ledger, setup, log)
    if finding is not None and log.engine_dead:
        finding = _died(finding)
    return finding


def phase_text(phase: OomPhase) -> str:
    return _PHASE_TEXT[phase]


def _inferred_kv_refusal(ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    """vLLM refuses to start when one max_model_len request does not fit the KV cache it sized; a log cut before
    the refusal's text still shows the KV cache's size (`# GPU blocks`) and either max_model_len above it or a
    traceback through the check itself."""
    limit = setup.max_model_len
    if ledger.kv_tokens is None or ledger.kv_tokens <= 0 or not log.traceback:
        return None
    too_long = limit is not None and ledger.kv_tokens < limit.value
    if not (too_long or log.kv_check_failed):
        return None
    return kv_refusal(None, ledger, setup, log)


def _died(finding: Finding) -> Finding:
    summary = finding.summary.replace(_RAN_OUT, "vLLM died of an out-of-memory error", 1)
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
    not_the_budget = _not_the_budget(oom, phase, ledger, setup, log=log, lines=lines)
    if not_the_budget is not None:
        return not_the_budget
    if phase is OomPhase.PROFILING:  # the dummy batch is the configuration's choice, stranded memory or not
        return _before_kv(oom, ledger, setup, log, lines)
    if _stranded(oom) and phase is not OomPhase.GRAPH_CAPTURE:  # graphs allocate from private pools of their own
        return _finding(
            Cause.ALLOCATOR_FRAGMENTATION,
            f"{_RAN_OUT} while {phase_text(phase)}: PyTorch's allocator stranded the memory it needed",
            [*lines, _stranded_line(oom)],
            [remedies.expandable_segments(_stranded_why(oom), oom.device)],
        )
    return _after_kv(oom, phase, ledger, setup, log=log, lines=lines)


def _not_the_budget(
    oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, setup: Setup, *, log: LogFacts, lines: list[str]
) -> Finding | None:
    """The readings where vLLM's own budget is not what to tune, checked first: sleep mode's wake-up, memory that
    was free, another process, one step larger than any margin, weights beyond the card."""
    if phase is OomPhase.WAKE_UP:
        return _wake_up(lines)
    if _not_short(oom):
        return _not_a_shortage(oom, phase, lines)
    if ledger.others is not None and ledger.ceiling is not None and ledger.ceiling < ledger.utilization:
        return _another_process(oom, ledger, lines, _stranded(oom))
    if _larger_than_any_margin(oom, ledger):
        return _one_step_too_large(oom, phase, setup, log, lines)
    if phase is OomPhase.WEIGHT_LOADING or ledger.weights_fit() is False:
        return _weights_do_not_fit(oom, ledger, setup, lines)
    return _probably_weights(oom, ledger, setup, lines) if _beyond_any_budget(oom, ledger, phase) else None


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
    budget = ledger.budget_bytes
    held = oom.process_bytes or oom.allocated_bytes
    if budget and held is not None and not ledger.utilization_assumed and held < BEFORE_KV_SHARE * budget:
        return OomPhase.PROFILING, (
            f"vLLM's process held {gib(held)}, under {BEFORE_KV_SHARE:.0%} of its {gib(budget)} budget: the KV "
            "cache, which fills the budget, was not allocated yet"
        )
    return OomPhase.UNKNOWN, oom.phase_evidence


def _beyond_any_budget(oom: CudaOom, ledger: MemoryLedger, phase: OomPhase) -> bool:
    """PyTorch itself holding nearly the whole card, in no known phase, beyond any budget the log states: the
    weights before any budget applied, or a transient after a budget set that high. The log does not say which."""
    total = oom.total_bytes
    allocated = oom.allocated_bytes
    if phase is not OomPhase.UNKNOWN or not total or allocated is None:
        return False
    budget_allows = ledger.utilization if not ledger.utilization_assumed else 0.0
    return allocated >= BEYOND_ANY_BUDGET * total and budget_allows < BEYOND_ANY_BUDGET


def _not_short(oom: CudaOom) -> bool:
    """The card had the memory: free was at least twice the allocation and a tenth of the card."""
    tried, free, total = oom.tried_bytes, oom.free_bytes, oom.total_bytes
    if tried is None or free is None or not total:
        return False
    return free >= 2 * tried and free >= NOT_SHORT_FREE_SHARE * total


def _not_a_shortage(oom: CudaOom, phase: OomPhase, lines: list[str]) -> Finding:
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM's {oom.device} allocator failed while {phase_text(phase)} with the memory free: not a shortage "
            "that a memory flag fixes"
        ),
        evidence=(
            *lines,
            f"{gib(oom.free_bytes or 0)} was free for a {gib(oom.tried_bytes or 0)} allocation: the allocation failed "
            "for another reason than room",
        ),
        steps=(
            "read the error just before this one (an 'invalid argument' from the allocator, sleep mode's cumem "
            "allocator, a driver or runtime mismatch): no budget, parallelism or precision change applies",
        ),
    )


def _larger_than_any_margin(oom: CudaOom, ledger: MemoryLedger) -> bool:
    """One allocation that no budget could make room for: larger than the card, or short by more than a fifth of
    it (a lower budget leaves a transient a few hundredths of the card, not that)."""
    total = oom.total_bytes
    shortfall = oom.shortfall_bytes
    if not total or oom.tried_bytes is None or shortfall is None:
        return False
    return oom.tried_bytes >= (ledger.usable_bytes or total) or shortfall > MAX_TRANSIENT_SHARE * total


def _one_step_too_large(oom: CudaOom, phase: OomPhase, setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    recommendations = [
        r
        for r in (
            remedies.fewer_batched_tokens(setup, "one step's activations grow with max_num_batched_tokens"),
            sequences(setup, log, "the profile run and the sampler run max_num_seqs dummy requests"),
        )
        if r is not None
    ]
    lines.append(
        f"one allocation of {gib(oom.tried_bytes or 0)} against {gib(oom.total_bytes or 0)} on the card: no "
        "gpu_memory_utilization makes room for that, the step itself is too large"
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{_RAN_OUT} while {phase_text(phase)}: one step asked for more than any budget leaves",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=(
            "shrink the step that asked: an attention without a memory-efficient kernel materialises the whole "
            "score matrix (install flash-attention or pick another attention backend); a multimodal encoder's "
            "profile runs the largest image or video (--limit-mm-per-prompt, a smaller max image size through "
            "--mm-processor-kwargs); a long prefill (--max-num-batched-tokens, chunked prefill)",
        ),
    )


def _probably_weights(oom: CudaOom, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    """PyTorch holding nearly the whole card with no phase in the log: most often weights that do not fit, and
    the remedies for that (more GPUs, offload) relieve a transient too; the other reading is a step, since its
    remedy (a lower budget) would not help weights."""
    total = oom.total_bytes or 0
    lines.append(
        f"PyTorch held {gib(oom.allocated_bytes or 0)} of the {gib(total)} card, beyond vLLM's default budget, with "
        "nothing in the log saying when: most often weights that do not fit; a transient after the KV cache under a "
        "budget set that high is the other reading"
    )
    finding = _weights_do_not_fit(oom, ledger, setup, lines)
    step = (
        f"if vLLM had printed 'Model loading took ... GiB' before the error, the weights fitted and a transient "
        f"after the KV cache did not: lower --gpu-memory-utilization by "
        f"{((oom.shortfall_bytes or 0) / total if total else 0) + 0.01:.3f} below what you set instead"
    )
    return replace(finding, steps=(*finding.steps, step))


def _stranded(oom: CudaOom) -> bool:
    """The stranded memory would have held what the allocation lacked, with room: at least 256 MiB, or, for a
    small shortfall, four times it (and more than the allocator's usual 64 MiB of slack)."""
    stranded = oom.reserved_unallocated_bytes
    shortfall = oom.shortfall_bytes
    if stranded is None or shortfall is None or stranded < shortfall:
        return False
    return stranded >= MIN_STRANDED_BYTES or stranded >= max(MIN_SLACK_BYTES, STRANDED_MARGIN * shortfall)


def _stranded_line(oom: CudaOom) -> str:
    return (
        f"{gib(oom.reserved_unallocated_bytes or 0)} reserved by PyTorch but unallocated, at least the "
        f"{gib(oom.shortfall_bytes or 0)} the {gib(oom.tried_bytes or 0)} allocation lacked "
        f"({gib(oom.free_bytes or 0)} free): the memory was there, split into pieces too small"
    )


def _stranded_why(oom: CudaOom) -> str:
    return (
        f"{gib(oom.reserved_unallocated_bytes or 0)} stranded >= {gib(oom.shortfall_bytes or 0)} short: expandable "
        "segments let PyTorch's allocator grow a segment in place instead of stranding split ones (PyTorch's own "
        "OOM message suggests it)"
    )


def _wake_up(lines: list[str]) -> Finding:
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not map its memory back waking from sleep mode: something else took it meanwhile",
        evidence=tuple(lines),
        steps=(
            "vLLM maps back the weights and the KV cache its --gpu-memory-utilization sized at start; a process "
            "sharing the card (an RL trainer) still holds what they need",
            "free the other process's memory before wake_up (torch.cuda.empty_cache, offload its optimizer), or "
            "lower vLLM's --gpu-memory-utilization by what the other process keeps: the log states neither amount",
        ),
    )


def _another_process(oom: CudaOom, ledger: MemoryLedger, lines: list[str], stranded: bool) -> Finding:
    recommendations: list[Recommendation] = []
    within = remedies.budget_within_free(ledger)
    steps: tuple[str, ...] = ()
    if within is not None:
        recommendations.append(within)
    elif ledger.ceiling is not None and ledger.ceiling < remedies.MIN_USEFUL_UTILIZATION:
        lines.append(
            f"what the other processes leave is {ledger.ceiling:.2f} of the card, too little to serve from: free the "
            "GPU first (a previous vLLM still exiting, another job), or move vLLM to another GPU"
        )
    else:
        steps = ("the budget already fits beside the other processes: what vLLM itself held was over it",)
    if stranded:
        lines.append(_stranded_line(oom))
        recommendations.append(remedies.expandable_segments(_stranded_why(oom), oom.device))
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{_RAN_OUT} while {phase_text(oom.phase)}: another process holds part of the card",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=steps,
    )


def _weights_do_not_fit(oom: CudaOom, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    held = oom.process_bytes if oom.process_bytes is not None else (oom.allocated_bytes or 0)
    needed: float = held + (oom.tried_bytes or 0)
    what = f"at least {gib(needed)} held or asked for when the load failed"
    high = ledger.weights_high_bytes
    if ledger.weights is not None and high is not None and high > needed:
        # Remedies are sized from the high end of an estimate: more GPUs or offload than needed still start.
        needed, what = high, ledger.weights.source
    lines.append(
        f"the weights need at least {gib(needed)} per GPU"
        + (f" of a {gib(ledger.total.value_bytes)} card" if ledger.total is not None else "")
        + ": gpu_memory_utilization does not cap weight loading, lowering it cannot help"
    )
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="the model's weights do not fit the GPU at this precision and parallelism",
        evidence=tuple(lines),
        recommendations=tuple(remedies.smaller_model_per_gpu(ledger, setup, needed, what)),
    )


def _before_kv(oom: CudaOom, ledger: MemoryLedger, setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    """The profile run's dummy batch did not fit beside the weights: the budget does not cap it. Fewer sequences
    and batched tokens come first (the dummy batch is theirs); stranded memory adds expandable segments."""
    if ledger.weights_fit() is False:
        return _weights_do_not_fit(oom, ledger, setup, lines)
    recommendations = [
        r
        for r in (
            remedies.fewer_batched_tokens(setup, "the profile run's dummy batch is max_num_batched_tokens long"),
            sequences(setup, log, "the profile run and its sampler run max_num_seqs dummy requests"),
        )
        if r is not None
    ]
    if _stranded(oom):
        lines.append(_stranded_line(oom))
        recommendations.append(
            remedies.expandable_segments(f"and, as the memory was stranded: {_stranded_why(oom)}", oom.device)
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
                f"lower --gpu-memory-utilization by {step:.3f} below what you set (the log does not say it; from "
                f"vLLM's default {ledger.utilization:g} that is {lowered.value}): the transient lacked "
                f"{gib(oom.shortfall_bytes or 0)} of {gib(ledger.total.value_bytes)}"
            )
    if phase in (OomPhase.GRAPH_CAPTURE, OomPhase.WARMUP, OomPhase.AFTER_KV_CACHE):
        if phase is not OomPhase.AFTER_KV_CACHE:
            fewer = fewer_graphs(setup, log, lines)
            if fewer is not None:
                recommendations.append(fewer)
        if not (log.args is not None and log.args.enforce_eager):
            recommendations.append(
                Recommendation(
                    flag="--enforce-eager",
                    value="",
                    why="or no CUDA graphs at all: their memory is freed, at the cost of slower decoding",
                )
            )
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
    if not recommendations and not steps:
        steps.append(
            "the log states neither the allocation nor the card: lower --gpu-memory-utilization a few hundredths "
            "below what you set, or find PyTorch's 'Tried to allocate ... of which ... is free' line to size it"
        )
    cause_text = "a transient the budget did not leave room for"
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{_RAN_OUT} while {phase_text(phase)}: {cause_text}",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=tuple(steps),
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
    if oom.allocated_bytes is not None:
        parts.append(f"PyTorch had allocated {gib(oom.allocated_bytes)}")
    if oom.tried_bytes is None:
        parts.append(f"no sizes in the message: {oom.message[:200]}")
    return "; ".join(parts)
