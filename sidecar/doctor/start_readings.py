"""vLLM's refusals to start, read against the memory ledger: free memory, the KV cache, the sampler. Pure.

* Free memory below the budget: another process holds the rest; the budget must fit in what is free.
* One max_model_len request does not fit the KV cache (the refusal, or `# GPU blocks` x block size below
  max_model_len before a traceback): a shorter `--max-model-len` (what the cache holds, when that is at least a
  real request's 256 tokens), or more KV memory where the card has it.
* No KV cache at all (`No available memory for the cache blocks`, a negative KV budget, zero blocks, or room for
  fewer than 256 tokens): the weights decide. Weights that do not fit are `does_not_fit`;
  weights that fit mean the budget is short of them plus the profile run's activations: a larger budget within
  what is free, or fewer sequences and batched tokens when the activations are what ate it.
  Where the log states the budget but not the card, the smallest common card its numbers allow stands in
  (card_size.py): weights that leave it a sliver of KV cache at the highest budget do not fit.
* The sampler's warm-up with max_num_seqs dummy requests: fewer sequences; a lower budget only when the
  warm-up ran after the KV cache was allocated (in the profile run the budget does not cap it).
* The memory profile's own check (free memory did not fall while vLLM loaded and profiled): the card's free count
  moved underneath vLLM (another process freed memory) or is not the device's (a GPU-sharing layer): no flag.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sidecar.doctor import formula, remedies
from sidecar.doctor.blowout import DEFAULT_BLOCK_SIZE, derived_max_len
from sidecar.doctor.card_size import LikelyCard, likely_card
from sidecar.doctor.cpu_kv import explicit_space_short, space_for_length
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, MIB, gib, tokens
from sidecar.doctor.ledger import FITS_SHARE, Amount, MemoryLedger
from sidecar.doctor.logfacts import LogFacts, OomPhase, Refusal, RefusalKind
from sidecar.doctor.setup import DEFAULT_UTILIZATION, V0_MAX_NUM_SEQS, Setup
from sidecar.doctor.versions import available

MIN_REQUEST_TOKENS = 256  # a KV cache that holds less than one such request is a sliver: the model is the problem
LARGE_ACTIVATION_SHARE = 0.25  # activations over this share of the budget are what ate the KV cache
MANY_SEQUENCES = 512  # max_num_seqs from here on (V1's 1024 default on large cards) is worth halving first
FOREIGN_NON_TORCH_BYTES = 4 * GIB  # non-torch memory from here on is not vLLM's own: another process's, profiled
# More than an uneven split of the weights gives (pipeline stages holding the embedding or the LM head: a few GiB
# for the largest vocabularies).
UNEVEN_RANKS_BYTES = 4 * GIB
MIN_USEFUL_KV_BYTES = 0.5 * GIB  # a KV cache under this at the highest budget is a sliver: the weights do not fit
SAMPLER_UTILIZATION_STEP = 0.02  # what to give up for the sampler's peak when max_num_seqs stays


def free_memory_refusal(refusal: Refusal, ledger: MemoryLedger) -> Finding:
    """The refusal states every amount it needs: free and total at start, the budget asked for."""
    free = (refusal.free_gib or 0.0) * GIB
    total = (refusal.total_gib or 0.0) * GIB
    asked = (
        f"gpu_memory_utilization {refusal.utilization:g} asks for {refusal.requested_gib:.2f} GiB"
        if refusal.utilization is not None and refusal.requested_gib is not None
        else "the budget asked for is cut off in the log"
    )
    lines = [
        f"vLLM refused to start: {refusal.line}",
        f"free at start {gib(free)} of {gib(total)}; {asked}: {gib(total - free)} is held by other processes (or a "
        "previous vLLM)",
    ]
    recommendations: list[Recommendation] = []
    if total > 0:
        computed = formula.utilization(int(total), int(total - free), 0)
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


def kv_refusal(refusal: Refusal | None, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    """One max_model_len request does not fit the KV cache; None when the KV cache is a sliver (no_kv_room)."""
    if refusal is not None and refusal.kind is not RefusalKind.MAX_LEN_EXCEEDS_KV:
        return None
    fits = derived_max_len(refusal) if refusal is not None else ledger.kv_tokens
    wanted = (refusal.max_model_len if refusal is not None else None) or (
        setup.max_model_len.value if setup.max_model_len is not None else None
    )
    if refusal is not None and fits is None:
        return _capacity_cut(refusal, ledger, wanted)
    if fits is None or fits < MIN_REQUEST_TOKENS:
        return None  # a sliver: the model or the budget is the problem, not max_model_len (no_kv_room)
    block, value = _to_blocks(fits, setup)
    if refusal is not None:
        lines = [f"vLLM refused to start: {refusal.line}"]
        where = _where(refusal)
    else:
        limit = (
            f"max_model_len is {tokens(wanted)} ({setup.max_model_len.source})"
            if wanted is not None and setup.max_model_len is not None
            else "the traceback runs through vLLM's check that it holds one max_model_len request"
        )
        lines = [
            f"the KV cache holds {tokens(fits)} tokens ({ledger.kv_tokens_source}) and {limit}: vLLM refuses to "
            "start when one request of max_model_len does not fit (the refusal's own text is not in the log)"
        ]
        where = "KV capacity"
    lines.extend(ledger.lines())
    recommendations = [
        Recommendation(
            flag="--max-model-len",
            value=value,
            why=f"vLLM's {where}: {tokens(fits)} tokens, rounded down to the block size {block} -> {value}",
        )
    ]
    if wanted is not None:
        recommendations.extend(_more_kv(refusal, ledger, setup, log, wanted=wanted, fits=fits, lines=lines))
    said = f" {tokens(wanted)}" if wanted is not None else ""
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=f"vLLM could not start: max_model_len{said} is more than its KV cache holds ({tokens(fits)} tokens)",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _capacity_cut(refusal: Refusal, ledger: MemoryLedger, wanted: int | None) -> Finding:
    """The refusal's words with its count of tokens cut off (an excerpt that ends at the parenthesis): the cause is
    known, the length that fits is not, and no number is made up for it."""
    said = f" {tokens(wanted)}" if wanted is not None else ""
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=f"vLLM could not start: max_model_len{said} is more than its KV cache holds",
        evidence=(f"vLLM refused to start: {refusal.line}", *ledger.lines()),
        steps=(
            "the refusal's end, cut from this log, says how many tokens the KV cache holds: set --max-model-len at "
            "most that, rounded down to the block size (16), or give the KV cache more memory (a larger "
            "--gpu-memory-utilization up to 0.95 where the card has room, --kv-cache-dtype fp8, or more GPUs)",
        ),
    )


def state_blocks(refusal: Refusal) -> Finding:
    """A hybrid model keeps one state block per running sequence (Mamba, linear attention), taken from the same
    budget as the KV cache: vLLM refuses a max_num_seqs above the blocks there are."""
    asked, blocks = refusal.max_num_seqs or 0, refusal.state_blocks or 0
    recommendations = (
        (
            Recommendation(
                flag="--max-num-seqs",
                value=blocks,
                why=f"one state block per running sequence: {blocks} blocks -> at most {blocks} sequences",
            ),
        )
        if blocks >= 1
        else ()
    )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM could not start: max_num_seqs {asked} is more than the {blocks} state blocks this hybrid model has"
        ),
        evidence=(f"vLLM refused to start: {refusal.line}",),
        recommendations=recommendations,
        steps=(
            "or keep the sequences and give the blocks more memory: they come out of the same budget as the KV "
            "cache (--gpu-memory-utilization, within what the card has free)",
        ),
    )


def prompt_over_kv(refusal: Refusal, ledger: MemoryLedger, setup: Setup) -> Finding:
    """V0 before 0.2.7 started with a max_model_len its KV cache could not hold, and ignored each prompt longer
    than the whole cache (finished with no output): the start-time refusal of later releases, one request late."""
    prompt = refusal.prompt_tokens or 0
    limit = setup.max_model_len
    said = f" {tokens(limit.value)} ({limit.source})" if limit is not None else ""
    lines = [f"vLLM ignored a request: {refusal.line} (finished with no output)", *ledger.lines()]
    fits = ledger.kv_tokens
    recommendations: list[Recommendation] = []
    steps: tuple[str, ...] = ()
    if fits is not None and fits >= MIN_REQUEST_TOKENS:
        block, value = _to_blocks(fits, setup)
        why = (
            f"the KV cache holds {tokens(fits)} tokens ({ledger.kv_tokens_source}), rounded down to {block} -> {value}"
        )
        recommendations.append(Recommendation(flag="--max-model-len", value=value, why=why))
    else:
        steps = (
            "find '# GPU blocks: N' among vLLM's start lines: the KV cache holds N x the block size (16) tokens, "
            f"fewer than {tokens(prompt)}; set --max-model-len at most that, or give the KV cache more memory: "
            "--gpu-memory-utilization up to 0.95, or --tensor-parallel-size to split the weights over more GPUs",
        )
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM's KV cache holds fewer than {tokens(prompt)} tokens: it ignored a prompt that long, which "
            f"max_model_len{said} let in"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=steps,
    )


def _to_blocks(tokens: int, setup: Setup) -> tuple[int, int]:
    """The block size and `tokens` rounded down to it: a length the KV cache holds whole blocks of."""
    block = setup.block_size.value if setup.block_size is not None else DEFAULT_BLOCK_SIZE
    return block, tokens // block * block


def no_kv_room(line: str | None, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    """Nothing (or a sliver) is left for the KV cache: whether the weights fit decides the direction."""
    lines = [f"vLLM refused to start: {line}"] if line else []
    if log.num_gpu_blocks == 0:
        lines.append("vLLM sized its KV cache at 0 blocks")
    lines.extend(ledger.lines())
    uneven = _uneven_ranks(log)
    if uneven is not None:
        return _rank_card_shared(uneven, lines)
    if log.cpu_kv_space is not None:
        return explicit_space_short(log.cpu_kv_space, lines)
    fit = ledger.weights_fit()
    weights = ledger.weights
    unfit = _weights_leave_no_room(fit, ledger, setup, lines)
    if unfit is not None:
        return unfit
    # At the highest budget already, nothing is raised: _short_at_full_budget reads the card's floor instead.
    raisable = fit is None and ledger.utilization < ledger.max_utilization
    card = likely_card(ledger, ledger.max_utilization) if raisable else None
    if card is not None and weights is not None and card.kv_at_bytes < MIN_USEFUL_KV_BYTES:
        return _weights_fill_likely_card(card, weights, ledger, setup, lines)
    recommendations = _room_for_kv(ledger, setup, log, lines)
    if fit is None:
        lines.append(card.why if card is not None else _what_would_decide(ledger))
    if ledger.non_torch is not None and ledger.non_torch.value_bytes >= FOREIGN_NON_TORCH_BYTES:
        lines.append(
            f"non-torch memory {gib(ledger.non_torch.value_bytes)} is more than vLLM's own takes (the CUDA context, "
            "NCCL and cuBLAS: under 2 GiB): vLLM counts memory another process took on the card while it profiled "
            "as its own, so a start once that process is done, or a card of its own, may leave the KV cache room"
        )
    if not recommendations:
        return _short_at_full_budget(ledger, setup, lines)
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the budget holds the weights and activations but leaves no KV cache",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _uneven_ranks(log: LogFacts) -> str | None:
    """The ranks of one engine hold equal shares of the weights under one budget, so their KV caches differ by
    little; one rank short by more than any uneven split explains, while another has room, had less of its card:
    something outside this engine holds memory there. The line that says so, or None."""
    least, most = log.available_kv_gib, log.available_kv_max_gib
    if least is None or most is None or least > 0 or most * GIB < MIN_USEFUL_KV_BYTES:
        return None
    if (most - least) * GIB < UNEVEN_RANKS_BYTES:
        return None
    return (
        f"the ranks' available KV cache memory runs from {least:.2f} GiB to {most:.2f} GiB: with the weights split "
        f"evenly under one budget, a gap of {most - least:.2f} GiB is memory outside this engine on the short rank's "
        "card (another process, or another engine or stage started beside it), counted as its non-torch memory"
    )


def _rank_card_shared(uneven: str, lines: list[str]) -> Finding:
    lines.append(uneven)
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: one rank's card holds memory outside this engine, and its KV cache got none",
        evidence=tuple(lines),
        steps=(
            "run nvidia-smi on each card before the start: the short rank's card lists the other process; give it a "
            "card of its own or start it after vLLM, or (another stage of one deployment) give each stage a "
            "gpu_memory_utilization that together stay under the card",
            "not more GPUs or a shorter --max-model-len: the other ranks had room, so the weights fit, and V1 sizes "
            "the KV cache from the budget, not from the length",
        ),
    )


def _weights_leave_no_room(fit: bool | None, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding | None:
    """The weights take too much of the card for any budget (`fit` False), or leave the highest budget a sliver of
    KV cache; None where a budget may still make room."""
    weights = ledger.weights
    if weights is None:
        return None
    left = _kv_at_highest_budget(ledger)
    if fit is False and ledger.usable_bytes is None:
        return _weights_beyond_any_device(weights, ledger, setup, lines)
    if fit is False:
        lines.append(
            f"the weights alone take {weights.value_bytes / (ledger.usable_bytes or 1):.0%} of what the card gives "
            "vLLM: no budget leaves the activations and a KV cache room"
        )
        summary = "the model does not fit: its weights leave no room for the KV cache on this GPU"
    elif fit is None and left is not None and left < MIN_USEFUL_KV_BYTES:
        lines.append(
            f"at gpu_memory_utilization {ledger.max_utilization:g}, the highest worth setting, the KV cache would get "
            f"{gib(left)}: under {gib(MIN_USEFUL_KV_BYTES)}, about a thousand tokens of a 7B model with full "
            "attention heads, too little to serve from, so the weights are what does not fit"
        )
        summary = "the model does not fit: even the highest budget leaves its KV cache a sliver"
    else:
        return None
    recommendations = tuple(remedies.smaller_model_per_gpu(ledger, setup, weights.value_bytes, weights.source))
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary=summary,
        evidence=tuple(lines),
        recommendations=recommendations,
        steps=()
        if recommendations
        else (
            "smaller weights: a 4-bit (AWQ or GPTQ) checkpoint of the same model takes about a third of 16-bit "
            "weights, or a smaller model",
        ),
    )


def _weights_beyond_any_device(weights: Amount, ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    """Weights per device larger than any GPU or TPU chip: the card's size does not matter. The remedies are sized
    against what the budget held (the profiling line's parts), a floor of what the card gives vLLM, so they ask
    for more, never less; with no such floor they are steps."""
    lines.append(
        f"the weights alone, {gib(weights.value_bytes)} per {ledger.unit}, are more than any {ledger.unit} holds "
        "(the largest carry 288 GB): no budget and no card of one device hold them"
    )
    held = ledger.budget_held_bytes
    recommendations: list[Recommendation] = []
    if held is not None:
        lines.append(
            f"the budget held {gib(held)} (weights + non-torch memory + activation peak + KV cache, "
            f"{ledger.non_torch.source if ledger.non_torch else 'the profiling line'}): the remedies are sized "
            "against that, the least the card gives vLLM"
        )
        floor = Amount(value_bytes=held, source="what the budget held", assumed=True)
        sized = replace(ledger, total=floor, others=None)
        recommendations = remedies.smaller_model_per_gpu(sized, setup, weights.value_bytes, weights.source)
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="the model does not fit: its weights per device are more than any one device holds",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=(
            "split the weights over more devices (--tensor-parallel-size, --pipeline-parallel-size), keep part of "
            "them in CPU memory (--cpu-offload-gb), or use a smaller or 4-bit checkpoint",
        ),
    )


def _kv_at_highest_budget(ledger: MemoryLedger) -> float | None:
    """The KV cache the highest budget worth recommending would leave, where the log states the card, the budget
    and what it held before the KV cache; None where it does not."""
    total, needed = ledger.total, _non_kv_bytes(ledger)
    if total is None or needed is None or ledger.utilization_assumed or ledger.kv is None:
        return None
    return remedies.highest_budget(ledger) * total.value_bytes - needed


def _weights_fill_likely_card(
    card: LikelyCard, weights: Amount, ledger: MemoryLedger, setup: Setup, lines: list[str]
) -> Finding:
    """The weights leave the smallest card the log allows no KV cache worth serving from, even at the highest
    budget: a raise would start vLLM with a sliver of cache, or not at all. Smaller weights on the same card are
    the way out; more GPUs only as a step, since the log says neither the card nor how many there are."""
    lines.append(card.why)
    lines.append(
        f"under {gib(MIN_USEFUL_KV_BYTES)} of KV cache is about a thousand tokens of a 7B model with full attention "
        "heads: too little to serve from, so the weights are what does not fit"
    )
    assumed = Amount(value_bytes=card.total_bytes, source="the smallest common card the log allows", assumed=True)
    sized = replace(ledger, total=assumed)
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="the model does not fit: on a card of the size the log implies, its weights leave no KV cache",
        evidence=tuple(lines),
        recommendations=tuple(
            remedies.smaller_model_per_gpu(sized, setup, weights.value_bytes, weights.source, more_gpus=False)
        ),
        steps=(
            f"if the card is larger than {gib(card.total_bytes)} (nvidia-smi says), a larger --gpu-memory-utilization "
            "may leave the KV cache room; with a second GPU, --tensor-parallel-size 2 halves the weights on each; a "
            "4-bit (AWQ or GPTQ) checkpoint of the same model takes about a third of 16-bit weights",
        ),
    )


def _what_would_decide(ledger: MemoryLedger) -> str:
    if ledger.weights is None:
        missing = "the weights' size is not in the log ('Model loading took W GiB' says it)"
    elif ledger.total is None:
        missing = "the card's size is not in the log (the OOM message, the memory-profiling line or NVML say it)"
    else:
        missing = (
            f"the weights take between {FITS_SHARE:.0%} and {ledger.does_not_fit_share:.0%} of what the card gives vLLM"
        )
    return (
        f"whether the weights fit is not decided: {missing}; if they take most of the card, the model does not fit "
        "and --tensor-parallel-size or --quantization is the way out"
    )


def _short_at_full_budget(ledger: MemoryLedger, setup: Setup, lines: list[str]) -> Finding:
    """No larger budget and no smaller batch to give: with the weights measured and the budget at vLLM's default
    or more, the model is what does not fit. The budget held at least the weights less the KV shortfall, so the
    card is at least that over the budget's share: remedies sized against that floor ask for more, never less."""
    weights, kv = ledger.weights, ledger.kv
    if (
        weights is not None
        and not weights.assumed
        and kv is not None
        and not ledger.utilization_assumed
        and ledger.utilization >= DEFAULT_UTILIZATION
    ):
        floor = (weights.value_bytes + min(0.0, kv.value_bytes)) / ledger.utilization
        card = ledger.total.value_bytes if ledger.total is not None else floor
        lines.append(
            f"gpu_memory_utilization is already {ledger.utilization:g}: the budget held at least "
            f"{gib(weights.value_bytes + min(0.0, kv.value_bytes))} (the weights less the KV shortfall), so the card "
            f"has at least {gib(card)}; the weights are what does not fit"
        )
        sized = ledger if ledger.total is not None else replace(ledger, total=Amount(value_bytes=card, source="floor"))
        return Finding(
            cause=Cause.DOES_NOT_FIT,
            severity=Severity.CRITICAL,
            summary="the model does not fit: at this budget its weights leave no room for the KV cache",
            evidence=tuple(lines),
            recommendations=tuple(remedies.smaller_model_per_gpu(sized, setup, weights.value_bytes, weights.source)),
        )
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: nothing is left for the KV cache, and the log does not say why",
        evidence=tuple(lines),
        steps=(
            "find 'Model loading took W GiB' and the memory-profiling line in vLLM's start: weights near the "
            "card's size need more GPUs or quantization; weights that fit need a larger --gpu-memory-utilization "
            "or fewer --max-num-seqs",
        ),
    )


def sampler_warmup(refusal: Refusal, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    dummy = refusal.dummy_requests or 0
    lines = [f"vLLM could not start: {refusal.line}", *ledger.lines()]
    recommendations: list[Recommendation] = []
    halved = remedies.fewer_sequences(
        dummy,
        "the dummy requests of the warm-up",
        f"the sampler warm-up runs max_num_seqs = {dummy} dummy requests at once and its logits did not fit; halving "
        "it halves that peak (vLLM's own message names this flag)",
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
        summary=f"vLLM ran out of memory warming up its sampler with {dummy} dummy requests (max_num_seqs)",
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


def sequences(setup: Setup, log: LogFacts, why: str) -> Recommendation | None:
    """Half of max_num_seqs as the arguments or vLLM's default state it (V0's 256 when the log shows V0)."""
    seqs = setup.max_num_seqs
    if seqs is not None:
        return remedies.fewer_sequences(seqs.value, seqs.source, why)
    if log.engine == "v0" and (setup.version is None or setup.version < (0, 8, 0)):
        return remedies.fewer_sequences(V0_MAX_NUM_SEQS, "V0's default, assumed: the log shows the V0 engine", why)
    return None


def _room_for_kv(ledger: MemoryLedger, setup: Setup, log: LogFacts, lines: list[str]) -> list[Recommendation]:
    recommendations: list[Recommendation] = []
    needed = _non_kv_bytes(ledger)
    current = None if ledger.utilization_assumed else ledger.utilization
    if current is None or ledger.ceiling is None or current < ledger.ceiling:
        raised = remedies.raise_budget(
            ledger, needed, "the budget holds the weights and activations but leaves no KV cache", current=current
        )
        if raised is not None:
            recommendations.append(raised)
    activation = ledger.activation
    budget = ledger.budget_bytes
    large = activation is not None and budget and activation.value_bytes >= LARGE_ACTIVATION_SHARE * budget
    if large and activation is not None:
        lines.append(f"the profile run's activations take {activation.value_bytes / (budget or 1):.0%} of the budget")
        batched = remedies.fewer_batched_tokens(setup, "the profile run's activations grow with max_num_batched_tokens")
        if batched is not None:
            recommendations.append(batched)
    seqs = setup.max_num_seqs
    if large or (seqs is not None and seqs.value >= MANY_SEQUENCES):
        fewer = sequences(setup, log, "the profile run and the sampler run max_num_seqs dummy requests")
        if fewer is not None:
            recommendations.append(fewer)
    eager = without_graphs(log)
    if eager is not None:
        recommendations.append(eager)
    return recommendations


def without_graphs(log: LogFacts) -> Recommendation | None:
    """vLLM 0.2x profiles CUDA graphs' memory before it sizes the KV cache and keeps it out of the KV budget:
    without graphs, that memory goes to the KV cache (for some decode speed)."""
    if not log.graphs_profiled or (log.args is not None and log.args.enforce_eager):
        return None
    return Recommendation(
        flag="--enforce-eager",
        value="",
        why=(
            "vLLM profiled CUDA graphs' memory before sizing the KV cache and kept it out of the KV budget: "
            "without graphs that memory is the KV cache's (decoding runs slower)"
        ),
    )


def _non_kv_bytes(ledger: MemoryLedger) -> float | None:
    """What the budget must hold before any KV cache: weights + activations + non-torch memory, as the profile
    line states them, or the budget less a negative KV budget."""
    if ledger.kv is not None and ledger.kv.value_bytes < 0 and ledger.budget_bytes is not None:
        return ledger.budget_bytes - ledger.kv.value_bytes
    if ledger.weights is None:
        return None
    weights = ledger.weights_high_bytes or ledger.weights.value_bytes
    return weights + sum(part.value_bytes for part in (ledger.activation, ledger.non_torch) if part is not None)


def _where(refusal: Refusal) -> str:
    if refusal.estimated_max_len is not None:
        return "estimate of the longest request its KV cache holds"
    if refusal.capacity_tokens is not None:
        return "KV capacity"
    error = refusal.printed_half_unit_gib
    return (
        f"numbers (no estimate in the log): {refusal.max_model_len:,} tokens x {refusal.available_gib:g} GiB "
        f"available / {refusal.needed_gib:g} GiB needed, each at the end of its printed rounding (+-{error:g} GiB) "
        "that fits fewer, the KV cache growing linearly with the length, ="
    )


def _more_kv(
    refusal: Refusal | None,
    ledger: MemoryLedger,
    setup: Setup,
    log: LogFacts,
    *,
    wanted: int,
    fits: int,
    lines: list[str],
) -> list[Recommendation]:
    """The other ways out: a KV cache large enough for max_model_len where the card allows it."""
    out: list[Recommendation] = []
    args = log.args
    if (
        args is not None
        and args.kv_cache_memory_bytes is not None
        and available("--kv-cache-memory-bytes", setup.version)
    ):
        needed = args.kv_cache_memory_bytes * wanted / fits
        value = math.ceil(needed / MIB) * MIB
        out.append(
            Recommendation(
                flag="--kv-cache-memory-bytes",
                value=value,
                why=(
                    f"or keep max_model_len: {args.kv_cache_memory_bytes:,} bytes x {wanted:,} / {fits:,} tokens "
                    f"= {needed:,.0f} bytes, rounded up to a whole MiB -> {value}"
                ),
            )
        )
    elif log.cpu_kv_space is not None:  # the budget does not size an explicit CPU KV space: grow the space
        grown = space_for_length(log.cpu_kv_space, wanted, fits)
        if grown is not None:
            out.append(grown)
    elif refusal is not None and refusal.needed_gib is not None and refusal.available_gib is not None:
        raised = _raise_for_kv(refusal, ledger, lines)
        if raised is not None:
            out.append(raised)
    eager = without_graphs(log)
    if eager is not None:
        out.append(eager)
    if setup.kv_cache_dtype in (None, "auto") and 2 * fits >= wanted:
        out.append(
            Recommendation(
                flag="--kv-cache-dtype",
                value="fp8",
                why=f"or keep max_model_len: an fp8 KV cache holds twice the tokens, {tokens(2 * fits)} >= "
                f"{tokens(wanted)}",
            )
        )
    return out


def _raise_for_kv(refusal: Refusal, ledger: MemoryLedger, lines: list[str]) -> Recommendation | None:
    total = ledger.total
    if total is None or refusal.needed_gib is None or refusal.available_gib is None or ledger.utilization_assumed:
        if total is None:
            lines.append("the GPU's total memory is not in the log: a larger --gpu-memory-utilization is not sized")
        return None
    missing = (refusal.needed_gib - refusal.available_gib) * GIB
    raised = math.ceil((ledger.utilization + missing / total.value_bytes) * 100 - 1e-6) / 100
    ceiling = ledger.ceiling
    if raised > ledger.max_utilization or (ceiling is not None and raised > ceiling):
        lines.append(
            f"a KV cache for max_model_len would need gpu_memory_utilization {raised:.2f}: the card cannot give it"
        )
        return None
    return Recommendation(
        flag="--gpu-memory-utilization",
        value=raised,
        why=(
            f"or keep max_model_len: {ledger.utilization:g} + ({refusal.needed_gib:.2f} - {refusal.available_gib:.2f} "
            f"GiB missing) / {gib(total.value_bytes)} = {ledger.utilization + missing / total.value_bytes:.4f}, "
            f"rounded up -> {raised:.2f}"
        ),
    )
