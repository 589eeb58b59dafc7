"""Does not fit: the weights, activations and KV cache at this precision need more than the card has.

From a log: nothing is left for the KV cache, or what is left is a sliver of the budget (under 10 %) and even
one max_model_len request does not fit. Live: the pool holds fewer than two p99 requests while vLLM already
takes 90 % of the card. The ways out are a smaller precision, more GPUs, or tiering weights to CPU. Pure.
"""

from __future__ import annotations

import math

from sidecar.doctor.blowout import MIN_REQUESTS, derived_max_len
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import tokens
from sidecar.doctor.logfacts import LogFacts, RefusalKind
from sidecar.doctor.setup import DEFAULT_UTILIZATION, Setup

MIN_KV_SHARE = 0.10  # below this share of (weights + KV) the cache is a sliver: the model is the problem
TARGET_KV_SHARE = 0.25  # what a remedy should leave for the KV cache, of the per-GPU weights + KV room
MIN_P99_REQUESTS = 2.0
FULL_CARD_UTILIZATION = 0.9
MAX_TENSOR_PARALLEL = 8
MIN_REQUEST_TOKENS = 256  # a KV cache that holds less than one such request is a sliver


def kv_room(log: LogFacts | None) -> tuple[float, float] | None:
    """(weights GiB, KV GiB) from a log that states both; the KV part may be negative."""
    if log is None or log.weights_gib is None:
        return None
    kv = log.available_kv_gib
    if kv is None and log.refusal is not None:
        kv = log.refusal.available_gib
    if kv is None and log.profile is not None:
        kv = log.profile.kv_gib
    return None if kv is None else (log.weights_gib, kv)


def weights_dominate(log: LogFacts | None) -> bool:
    room = kv_room(log)
    if room is None:
        return False
    weights, kv = room
    return kv <= 0 or weights + kv <= 0 or kv / (weights + kv) < MIN_KV_SHARE


def log_does_not_fit(evidence: Evidence, setup: Setup) -> Finding | None:
    log = evidence.log
    if log is None:
        return None
    refusal = log.refusal
    no_cache = refusal is not None and refusal.kind is RefusalKind.NO_CACHE_MEMORY
    sliver = (
        refusal is not None
        and refusal.kind is RefusalKind.MAX_LEN_EXCEEDS_KV
        and (weights_dominate(log) or (derived_max_len(refusal) or 0) < MIN_REQUEST_TOKENS)
    )
    if not (no_cache or sliver or (refusal is None and weights_dominate(log) and log.oom is None)):
        return None
    lines = [f"vLLM refused to start: {refusal.line}"] if refusal is not None else []
    room = kv_room(log)
    if room is not None:
        weights, kv = room
        lines.append(
            f"weights take {weights:.2f} GiB; {kv:.2f} GiB of the budget is left for the KV cache "
            f"({kv / (weights + kv):.1%} of weights + KV, under {MIN_KV_SHARE:.0%})"
            if kv > 0 and weights + kv > 0
            else f"weights take {weights:.2f} GiB; the budget is {-kv:.2f} GiB short before any KV cache"
        )
    elif log.available_kv_gib is not None and log.available_kv_gib <= 0:
        lines.append(
            f"vLLM's profile left {log.available_kv_gib:.2f} GiB for the KV cache: the budget is "
            f"{-log.available_kv_gib:.2f} GiB short before any KV cache (the weights' size is not in the log)"
        )
    if setup.gpu_memory_utilization is not None:
        utilization = setup.gpu_memory_utilization
        lines.append(f"gpu_memory_utilization {utilization.value:g} ({utilization.source})")
    remedies = _remedies(setup, room)
    if no_cache:
        remedies = [*_raise_budget(setup, lines), *remedies]
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="the model does not fit: weights and activations leave (almost) nothing for the KV cache",
        evidence=tuple(lines),
        recommendations=tuple(remedies),
    )


def _raise_budget(setup: Setup, lines: list[str]) -> list[Recommendation]:
    """No KV cache at all: first the budget itself, as vLLM's message says, when it is below vLLM's default."""
    utilization = setup.gpu_memory_utilization
    if utilization is not None and utilization.value >= DEFAULT_UTILIZATION:
        lines.append(f"gpu_memory_utilization is already {utilization.value:g}: the budget is not what is small")
        return []
    now = f"{utilization.value:g} ({utilization.source})" if utilization is not None else "not in the log"
    return [
        Recommendation(
            flag="--gpu-memory-utilization",
            value=DEFAULT_UTILIZATION,
            why=(
                f"vLLM's own advice: the budget (now {now}) holds the weights and activations but nothing for the KV "
                f"cache; vLLM's default {DEFAULT_UTILIZATION:g} gives it the room if the card is vLLM's alone (if it "
                "is already that high, the model does not fit: the other recommendations)"
            ),
        )
    ]


def live_does_not_fit(evidence: Evidence, setup: Setup) -> Finding | None:
    traffic = evidence.live.traffic
    pool = setup.kv_pool_tokens
    utilization = setup.gpu_memory_utilization
    if traffic is None or pool is None or utilization is None or traffic.requests < MIN_REQUESTS or pool.value <= 0:
        return None
    p99_prompt = traffic.prompt.percentile_upper(0.99)
    p99_output = traffic.generation.percentile_upper(0.99)
    if p99_prompt is None or p99_output is None or p99_prompt + p99_output <= 0:
        return None
    if utilization.value < FULL_CARD_UTILIZATION:
        return None
    holds = pool.value / (p99_prompt + p99_output)
    if holds >= MIN_P99_REQUESTS:
        return None
    lines = [
        f"KV pool {tokens(pool.value)} tokens ({pool.source}) holds {holds:.2f} requests of the p99 size "
        f"({tokens(p99_prompt + p99_output)} tokens)",
        f"gpu_memory_utilization is already {utilization.value:g} ({utilization.source})",
    ]
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.WARNING,
        summary="at this precision the card holds fewer than two requests of the p99 size",
        evidence=tuple(lines),
        recommendations=tuple(_remedies(setup, None)),
    )


def _remedies(setup: Setup, room: tuple[float, float] | None) -> list[Recommendation]:
    remedies: list[Recommendation] = []
    if room is not None:
        weights, kv = room
        total_room = weights + kv
        if setup.quantization is None:
            remedies.append(
                Recommendation(
                    flag="--quantization",
                    value="fp8",
                    why=(
                        f"fp8 weights take half of 16-bit ones: {weights:.2f} -> {weights / 2:.2f} GiB, leaving "
                        f"{total_room - weights / 2:.2f} GiB for the KV cache (needs an fp8-capable GPU: Ada, "
                        "Hopper or newer; 4-bit AWQ/GPTQ checkpoints quarter it)"
                    ),
                )
            )
        tensor_parallel = _tensor_parallel(setup.tensor_parallel_size, weights, total_room)
        if tensor_parallel is not None:
            remedies.append(tensor_parallel)
        if total_room > 0:
            offload = math.ceil(TARGET_KV_SHARE * total_room - kv)
            remedies.append(
                Recommendation(
                    flag="--cpu-offload-gb",
                    value=offload,
                    why=(
                        f"tiering, the slow way out: {TARGET_KV_SHARE:.0%} of {total_room:.2f} GiB "
                        f"(weights + KV) {'-' if kv >= 0 else '+'} {abs(kv):.2f} GiB KV now = "
                        f"{TARGET_KV_SHARE * total_room - kv:.2f}, rounded up -> {offload} GiB of weights kept in "
                        "CPU memory (each step reads them over PCIe)"
                    ),
                )
            )
    else:
        doubled = min(MAX_TENSOR_PARALLEL, setup.tensor_parallel_size * 2)
        if doubled > setup.tensor_parallel_size:
            remedies.append(
                Recommendation(
                    flag="--tensor-parallel-size",
                    value=doubled,
                    why=f"{setup.tensor_parallel_size} -> {doubled} GPUs: each holds half the weights, the rest is KV",
                )
            )
    if setup.kv_cache_dtype in (None, "auto") and (room is None or room[1] > 0):
        remedies.append(
            Recommendation(
                flag="--kv-cache-dtype",
                value="fp8",
                why="an fp8 KV cache holds twice the tokens of a 16-bit one in the same memory",
            )
        )
    return remedies


def _tensor_parallel(current: int, weights: float, room: float) -> Recommendation | None:
    """The fewest GPUs (a power of two) whose share of the weights leaves 25 % of each GPU's room for KV."""
    if room <= 0:
        return None
    size = current * 2
    while size <= MAX_TENSOR_PARALLEL:
        share = weights / size * current
        if share <= (1 - TARGET_KV_SHARE) * room:
            return Recommendation(
                flag="--tensor-parallel-size",
                value=size,
                why=(
                    f"weights {weights * current:.2f} GiB / {size} GPUs = {share:.2f} GiB each, at most "
                    f"{1 - TARGET_KV_SHARE:.0%} of the {room:.2f} GiB per GPU for weights + KV"
                ),
            )
        size *= 2
    return None
