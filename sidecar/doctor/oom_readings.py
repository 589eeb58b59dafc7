"""The readings of an out-of-memory error where vLLM's own budget is not what to change. Pure.

Checked before the budget's readings (`log_memory`): memory the budget does not share out (outside_budget.py);
the card had the memory; another process holds what the budget counts on; one step asked for more than any
budget leaves; the weights do not fit the card.
"""

from __future__ import annotations

from dataclasses import replace

from sidecar.doctor import remedies
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase
from sidecar.doctor.outside_budget import outside_the_budget
from sidecar.doctor.phase import RAN_OUT, phase_text
from sidecar.doctor.remedies import sequences
from sidecar.doctor.resident import resident_beyond_weights, resident_memory
from sidecar.doctor.setup import Setup
from sidecar.doctor.stranded import stranded, stranded_line, stranded_why

BEYOND_ANY_BUDGET = 0.95  # PyTorch at this share of the card, 5 points over vLLM's default budget: weights, mostly
NOT_SHORT_FREE_SHARE = 0.1  # free at the error at least this share of the card (and twice the ask): no shortage
MAX_TRANSIENT_SHARE = 0.2  # a shortfall beyond this share of the card is no transient a budget makes room for


def not_the_budget(
    oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, setup: Setup, *, log: LogFacts, lines: list[str]
) -> Finding | None:
    """The readings where vLLM's own budget is not what to tune, checked first: a TPU kernel's on-chip scratch,
    sleep mode's wake-up, memory that was free, another process, one step larger than any margin, weights beyond
    the card."""
    if (outside := outside_the_budget(oom, phase, ledger=ledger, setup=setup, log=log, lines=lines)) is not None:
        return outside
    if _not_short(oom):
        return _not_a_shortage(oom, phase, lines)
    if ledger.others is not None and ledger.ceiling is not None and ledger.ceiling < ledger.utilization:
        return _beside_others(oom, phase, ledger, setup, lines)
    if _larger_than_any_margin(oom, ledger):
        return _one_step_too_large(oom, phase, setup, log, lines)
    if phase is OomPhase.WEIGHT_LOADING or ledger.weights_fit() is False:
        return _the_weights(oom, phase, ledger, setup, log=log, lines=lines)
    return _probably_weights(oom, ledger, setup, lines) if _beyond_any_budget(oom, ledger, phase) else None


def _the_weights(
    oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, setup: Setup, *, log: LogFacts, lines: list[str]
) -> Finding:
    """A weight load that failed, or weights the card cannot hold: the weights do not fit, unless the load
    failed in a process already holding far more than an earlier load of the same model measured."""
    if phase is OomPhase.WEIGHT_LOADING and (beyond := resident_beyond_weights(oom, ledger, log)) is not None:
        return resident_memory(log, beyond, lines)
    return weights_do_not_fit(oom, ledger, setup, lines)


def _beyond_any_budget(oom: CudaOom, ledger: MemoryLedger, phase: OomPhase) -> bool:
    """PyTorch itself holding nearly the whole card, in no known phase, beyond any budget the log states: the
    weights before any budget applied, or a transient after a budget set that high. The log does not say which,
    unless a worker returned the error to an RPC: its weights had loaded."""
    total = oom.total_bytes
    allocated = oom.allocated_bytes
    if phase is not OomPhase.UNKNOWN or oom.after_load or not total or allocated is None:
        return False
    budget_allows = ledger.utilization if not ledger.utilization_assumed else 0.0
    return allocated >= BEYOND_ANY_BUDGET * total and budget_allows < BEYOND_ANY_BUDGET


def _not_short(oom: CudaOom) -> bool:
    """The card had the memory: free was at least twice the allocation and a tenth of the card."""
    tried, free, total = oom.tried_bytes, oom.free_bytes, oom.total_bytes
    if tried is None or free is None or not total:
        return False
    return free >= 2 * tried and free >= NOT_SHORT_FREE_SHARE * total


# An allocation that failed inside torch.compile (Inductor wraps its errors, autotuning's among them): running
# eager skips the compile step where it failed. V1 turns compilation off with --enforce-eager where no
# compilation level is set.
_WITHOUT_COMPILE = Recommendation(
    flag="--enforce-eager",
    value="",
    why="the allocation failed inside torch.compile (Inductor's error): eager mode does not compile the model",
)


def _not_a_shortage(oom: CudaOom, phase: OomPhase, lines: list[str]) -> Finding:
    compiling = "InductorError" in (oom.message or "")
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
        recommendations=(_WITHOUT_COMPILE,) if compiling else (),
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
        summary=f"{RAN_OUT} while {phase_text(phase)}: one step asked for more than any budget leaves",
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
    held = (
        f"PyTorch held {gib(oom.allocated_bytes or 0)} of the {gib(total)} card, beyond vLLM's default budget, with "
        "nothing in the log saying when"
    )
    transient = (
        f"if vLLM had printed 'Model loading took ... GiB' before the error, the weights fitted and a transient "
        f"after the KV cache did not: lower --gpu-memory-utilization by "
        f"{((oom.shortfall_bytes or 0) / total if total else 0) + 0.01:.3f} below what you set"
    )
    split = setup.tensor_parallel_size
    if split >= 2 and not setup.tensor_parallel_unknown:
        # A model the log shows split over N GPUs was split to fit them: no bet on either reading.
        lines.append(
            f"{held}; the log shows the model split over {split} GPUs, so a budget set that high is as likely as "
            "weights that do not fit"
        )
        return Finding(
            cause=Cause.CONFIGURATION_OVERSHOOT,
            severity=Severity.CRITICAL,
            summary=f"{RAN_OUT} with PyTorch holding nearly the whole card; the log does not say in which step",
            evidence=tuple(lines),
            steps=(
                transient + ", or halve --max-num-batched-tokens (a long prefill's step)",
                "if not, the weights did not fit: twice today's --tensor-parallel-size, fewer bytes per weight, or "
                "--cpu-offload-gb; gpu_memory_utilization does not cap weight loading",
            ),
        )
    lines.append(
        f"{held}: most often weights that do not fit; a transient after the KV cache under a budget set that high "
        "is the other reading"
    )
    finding = weights_do_not_fit(oom, ledger, setup, lines)
    return replace(finding, steps=(*finding.steps, transient + " instead"))


def _stranded_covers_overcommit(oom: CudaOom, ledger: MemoryLedger) -> bool:
    """Beside other processes, stranded memory is a way out only when it covers what the budget overcommits (the
    budget less what the others leave): expandable segments give back the stranded pieces, not the memory another
    process holds, so a smaller stranded amount only moves the failure to the next allocation."""
    total, ceiling = ledger.total, ledger.ceiling
    if total is None or ceiling is None:
        return True
    overcommit = max(0.0, ledger.utilization - ceiling) * total.value_bytes
    return (oom.reserved_unallocated_bytes or 0) >= overcommit


def _beside_others(oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    """Other processes hold what the budget counts on: the budget must fit beside them, unless a load failed
    holding more than they do (its weights leave no room, and no budget caps a load)."""
    if phase is OomPhase.WEIGHT_LOADING and _load_outweighs_others(oom, ledger):
        return weights_do_not_fit(oom, ledger, setup, lines)
    return _another_process(oom, ledger, lines, stranded(oom) and _stranded_covers_overcommit(oom, ledger))


def _load_outweighs_others(oom: CudaOom, ledger: MemoryLedger) -> bool:
    """A load that failed holding more than the other processes hold: its own weights are the larger part of what
    left no room, and no budget caps a load. (Others holding more: freeing the card is the way, as before.)"""
    held = oom.held_bytes
    return held is not None and held >= ledger.others_bytes


def _another_process(oom: CudaOom, ledger: MemoryLedger, lines: list[str], stranded: bool) -> Finding:
    recommendations: list[Recommendation] = []
    within = remedies.budget_within_free(ledger)
    steps: tuple[str, ...] = ()
    if within is not None:
        recommendations.append(within)
    elif ledger.ceiling is not None and ledger.ceiling < remedies.MIN_USEFUL_UTILIZATION:
        lines.append(
            f"what the other processes leave is {ledger.ceiling:.2f} of the card, too little to serve a model of any "
            "size from: free the GPU first (a previous vLLM still exiting, another job), or move vLLM to another GPU"
        )
        usable, total = ledger.usable_bytes, ledger.total
        if usable is not None and total is not None:
            leftover = remedies.leftover_budget(total.value_bytes, usable, ledger.weights)
            recommendations += [leftover] if leftover is not None else []
    else:
        steps = ("the budget already fits beside the other processes: what vLLM itself held was over it",)
    if stranded:
        lines.append(stranded_line(oom))
        recommendations.append(remedies.expandable_segments(stranded_why(oom), oom.device))
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{RAN_OUT} while {phase_text(oom.phase)}: another process holds part of the card",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=steps,
    )


def weights_do_not_fit(oom: CudaOom, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    held, of_what = _held_at_failure(oom, ledger)
    needed: float = held + (oom.tried_bytes or 0)
    what = f"at least {gib(needed)} held or asked for when the load failed{of_what}"
    high = ledger.weights_high_bytes
    if ledger.weights is not None and high is not None and high > needed:
        # Remedies are sized from the high end of an estimate: more GPUs or offload than needed still start.
        needed, what = high, ledger.weights.source
    if needed <= 0:  # the message has no sizes and nothing else in the log sizes the weights
        lines.append("the log sizes neither the weights nor the card: " + _BUDGET_DOES_NOT_CAP_WEIGHTS)
        sized: list[Recommendation] = []
        steps: tuple[str, ...] = (
            "fewer bytes per weight (an AWQ or GPTQ checkpoint, or --quantization fp8 on a card that runs fp8), "
            "twice today's --tensor-parallel-size, or --cpu-offload-gb: the checkpoint's size (parameters x 2 "
            "bytes in 16 bits) against the card's memory sizes them",
        )
    else:
        unit = ledger.unit
        card = f" ({gib(ledger.total.value_bytes)} each)" if ledger.total is not None else ""
        lines.append(f"the weights need at least {gib(needed)} per {unit}{card}: " + _BUDGET_DOES_NOT_CAP_WEIGHTS)
        if ledger.others is not None and ledger.usable_bytes is not None:
            # A budget fitted beside them does not cap the load either: the load needs what they hold, or less.
            lines.append(
                f"other processes hold {gib(ledger.others_bytes)}, leaving {gib(ledger.usable_bytes)} for the load: "
                "the remedies are sized on that; freeing the card first is the other way out"
            )
        sized, steps = remedies.smaller_model_per_gpu(ledger, setup, needed, what), ()
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary=f"the model's weights do not fit the {ledger.unit} at this precision and parallelism",
        evidence=tuple(lines),
        recommendations=tuple(sized),
        steps=steps,
    )


def _held_at_failure(oom: CudaOom, ledger: MemoryLedger) -> tuple[float, str]:
    """What the failed process held, and how it is known where the message does not say it."""
    if oom.held_bytes is not None:
        return oom.held_bytes, ""
    if oom.device == "TPU" and oom.free_bytes is not None and ledger.total is not None:
        # libtpu gives a chip to one process at a time: what was not free on it was this process's.
        held = max(0, ledger.total.value_bytes - oom.free_bytes)
        return held, f" (the device's {gib(ledger.total.value_bytes)} less the {gib(oom.free_bytes)} free)"
    return 0, ""


_BUDGET_DOES_NOT_CAP_WEIGHTS = "gpu_memory_utilization does not cap weight loading, lowering it cannot help"
