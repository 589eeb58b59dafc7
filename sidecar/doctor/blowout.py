"""KV-cache blowout: max_model_len far above what requests really need, or more than the KV cache holds.

Live, it compares max_model_len with the p99 prompt + output length from vLLM's own token histograms; from a
log, it explains vLLM's refusal to start because one max_model_len request does not fit its KV cache. Pure.
"""

from __future__ import annotations

import math

from sidecar.doctor import formula
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, MIB, tokens
from sidecar.doctor.histogram import GENERATION_TOKENS, MAX_TOKENS_PARAM, PROMPT_TOKENS, Histogram
from sidecar.doctor.logfacts import Refusal, RefusalKind
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import available
from sidecar.model.gpu import ProcessOwner

MIN_REQUESTS = 50  # fewer finished requests are too thin a sample for a p99
BLOWOUT_RATIO = 2.0  # max_model_len at least this many times what p99 traffic needs
DEFAULT_BLOCK_SIZE = 16
MAX_RAISED_UTILIZATION = 0.95


def describe_bucket(histogram: Histogram, quantile: float) -> str:
    bucket = histogram.percentile_bucket(quantile)
    if bucket is None:
        return "no observations"
    upper = "+Inf" if bucket.upper is None else tokens(bucket.upper)
    return f"in ({tokens(bucket.lower)}, {upper}]"


def live_blowout(evidence: Evidence, setup: Setup) -> Finding | None:
    traffic = evidence.live.traffic
    limit = setup.max_model_len
    if traffic is None or limit is None or limit.value <= 0 or traffic.requests < MIN_REQUESTS:
        return None
    p99_prompt = traffic.prompt.percentile_upper(0.99)
    p99_output = traffic.generation.percentile_upper(0.99)
    if p99_prompt is None or p99_output is None or p99_prompt + p99_output <= 0:
        return None
    computed = formula.max_model_len(p99_prompt, p99_output, traffic.requests, f"{PROMPT_TOKENS} + {GENERATION_TOKENS}")
    if limit.value < BLOWOUT_RATIO * computed.value:
        return None
    lines = [
        f"max_model_len {tokens(limit.value)} ({limit.source})",
        f"p99 prompt {describe_bucket(traffic.prompt, 0.99)} tokens, p99 output "
        f"{describe_bucket(traffic.generation, 0.99)} tokens over {traffic.requests:,} finished requests "
        f"({PROMPT_TOKENS}, {GENERATION_TOKENS})",
        f"max_model_len is {limit.value / computed.value:.1f}x what p99 traffic needs ({computed.value})",
    ]
    pool = setup.kv_pool_tokens
    if pool is not None and pool.value > 0:
        lines.append(
            f"one max_model_len request can take {min(1.0, limit.value / pool.value):.0%} of the KV pool "
            f"({tokens(pool.value)} tokens, {pool.source}) and preempt everything else"
        )
    why = computed.why
    if traffic.max_tokens is not None and traffic.max_tokens.count:
        asked = traffic.max_tokens.percentile_upper(0.99)
        if asked is not None and p99_prompt + asked > computed.value:
            why += (
                f"; note: clients ask for up to {tokens(asked)} max_tokens (p99 of {MAX_TOKENS_PARAM}), and vLLM "
                "answers HTTP 400 when prompt + max_tokens exceeds max_model_len: cap max_tokens on the clients first"
            )
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.WARNING,
        summary=f"max_model_len {tokens(limit.value)} is far above the p99 request ({tokens(p99_prompt + p99_output)})",
        evidence=tuple(lines),
        recommendations=(Recommendation(flag="--max-model-len", value=computed.value, why=why),),
    )


def log_blowout(evidence: Evidence, setup: Setup, *, weights_dominate: bool) -> Finding | None:
    """A start refused because one max_model_len request does not fit the KV cache (unless the model is the
    problem: then it is `does_not_fit`)."""
    log = evidence.log
    if log is None or log.refusal is None or log.refusal.kind is not RefusalKind.MAX_LEN_EXCEEDS_KV:
        return None
    refusal = log.refusal
    fits = derived_max_len(refusal)
    if fits is None or fits <= 0 or weights_dominate or refusal.max_model_len is None:
        return None
    block = setup.block_size.value if setup.block_size is not None else DEFAULT_BLOCK_SIZE
    value = fits // block * block
    lines = [f"vLLM refused to start: {refusal.line}"]
    if refusal.estimated_max_len is not None:
        where = "estimate of the longest request its KV cache holds"
    elif refusal.capacity_tokens is not None:
        where = "KV capacity"
    else:
        where = (
            f"numbers (this version prints no estimate): {refusal.max_model_len:,} tokens x "
            f"{refusal.available_gib:.2f} GiB available / {refusal.needed_gib:.2f} GiB needed, the KV cache growing "
            "linearly with the length, ="
        )
    recommendations = [
        Recommendation(
            flag="--max-model-len",
            value=value,
            why=f"vLLM's {where}: {tokens(fits)} tokens, rounded down to the block size {block} -> {value}",
        )
    ]
    recommendations.extend(_more_memory(evidence, setup, refusal.max_model_len, fits, lines))
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM could not start: max_model_len {tokens(refusal.max_model_len)} is more than its KV cache holds "
            f"({tokens(fits)} tokens)"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def derived_max_len(refusal: Refusal) -> int | None:
    """The longest request the KV cache holds: vLLM's estimate, its V0 capacity, or max_model_len scaled by the
    available over the needed KV memory (V1 before 0.9 printed no estimate)."""
    if refusal.estimated_max_len is not None:
        return refusal.estimated_max_len
    if refusal.capacity_tokens is not None:
        return refusal.capacity_tokens
    if (
        refusal.max_model_len is not None
        and refusal.needed_gib is not None
        and refusal.available_gib is not None
        and refusal.needed_gib > 0
        and refusal.available_gib > 0
    ):
        return math.floor(refusal.max_model_len * refusal.available_gib / refusal.needed_gib)
    return None


def _more_memory(evidence: Evidence, setup: Setup, wanted: int, fits: int, lines: list[str]) -> list[Recommendation]:
    """The other way out: a KV cache large enough for max_model_len, where the card allows it."""
    log = evidence.log
    args = log.args if log is not None else None
    if (
        args is not None
        and args.kv_cache_memory_bytes is not None
        and available("--kv-cache-memory-bytes", setup.version)
    ):
        needed = args.kv_cache_memory_bytes * wanted / fits
        value = math.ceil(needed / MIB) * MIB
        return [
            Recommendation(
                flag="--kv-cache-memory-bytes",
                value=value,
                why=(
                    f"or keep max_model_len: {args.kv_cache_memory_bytes:,} bytes x {wanted:,} / {fits:,} tokens "
                    f"= {needed:,.0f} bytes, rounded up to a whole MiB -> {value}"
                ),
            )
        ]
    refusal = log.refusal if log is not None else None
    utilization = setup.gpu_memory_utilization
    card = setup.card
    if refusal is None or refusal.needed_gib is None or refusal.available_gib is None or utilization is None:
        return []
    if card is None or card.memory_total_bytes <= 0:
        lines.append("GPU total memory unknown (no GPU reading): a larger --gpu-memory-utilization is not sized")
        return []
    total = card.memory_total_bytes
    missing = (refusal.needed_gib - refusal.available_gib) * GIB
    raised = math.ceil((utilization.value + missing / total) * 100 - 1e-6) / 100
    others = sum(p.used_memory_bytes or 0 for p in card.processes if p.owner is ProcessOwner.OTHER)
    if raised > MAX_RAISED_UTILIZATION or raised * total + others > total * (1 - formula.RESERVE_RATIO):
        lines.append(
            f"a KV cache for max_model_len would need gpu_memory_utilization {raised:.2f}: the card cannot give it"
        )
        return []
    return [
        Recommendation(
            flag="--gpu-memory-utilization",
            value=raised,
            why=(
                f"or keep max_model_len: {utilization.value:g} + ({refusal.needed_gib:.2f} - "
                f"{refusal.available_gib:.2f} GiB missing) / {formula.gib(total)} = "
                f"{utilization.value + missing / total:.4f}, rounded up -> {raised:.2f}"
            ),
        )
    ]
