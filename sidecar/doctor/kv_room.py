"""No KV cache at all, read against the memory ledger: whether the weights fit decides the direction. Pure.

`No available memory for the cache blocks`, a negative KV budget, zero blocks, or room for fewer than 256 tokens
(`start_readings.kv_refusal` leaves a sliver here). Weights that do not fit are `does_not_fit`: more GPUs, fewer
bytes per weight or CPU offload, sized against what the card gives vLLM (or, where the log names no card, a floor
of it). Weights that fit mean the budget is short of them plus the profile run's activations: a larger budget
within what is free, or fewer sequences and batched tokens when the activations are what ate it. Where the log
states the budget but not the card, the smallest common card its numbers allow stands in (card_size.py): weights
that leave it a sliver of KV cache at the highest budget do not fit. One rank short while another has room means
something outside the engine holds memory on that rank's card.
"""

from __future__ import annotations

from dataclasses import replace

from sidecar.doctor import remedies
from sidecar.doctor.card_size import LikelyCard, likely_card
from sidecar.doctor.cpu_kv import explicit_space_short
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import FITS_SHARE, Amount, MemoryLedger
from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.remedies import sequences, without_graphs
from sidecar.doctor.setup import DEFAULT_UTILIZATION, Setup

LARGE_ACTIVATION_SHARE = 0.25  # activations over this share of the budget are what ate the KV cache
MANY_SEQUENCES = 512  # max_num_seqs from here on (V1's 1024 default on large cards) is worth halving first
FOREIGN_NON_TORCH_BYTES = 4 * GIB  # non-torch memory from here on is not vLLM's own: another process's, profiled
# More than an uneven split of the weights gives (pipeline stages holding the embedding or the LM head: a few GiB
# for the largest vocabularies).
UNEVEN_RANKS_BYTES = 4 * GIB
MIN_USEFUL_KV_BYTES = 0.5 * GIB  # a KV cache under this at the highest budget is a sliver: the weights do not fit


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


def _non_kv_bytes(ledger: MemoryLedger) -> float | None:
    """What the budget must hold before any KV cache: weights + activations + non-torch memory, as the profile
    line states them, or the budget less a negative KV budget."""
    if ledger.kv is not None and ledger.kv.value_bytes < 0 and ledger.budget_bytes is not None:
        return ledger.budget_bytes - ledger.kv.value_bytes
    if ledger.weights is None:
        return None
    weights = ledger.weights_high_bytes or ledger.weights.value_bytes
    return weights + sum(part.value_bytes for part in (ledger.activation, ledger.non_torch) if part is not None)
