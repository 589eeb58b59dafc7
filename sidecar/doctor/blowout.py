"""KV-cache blowout: max_model_len far above what requests really need, or more than the KV cache holds.

Live, it compares max_model_len with the p99 prompt + output length from vLLM's own token histograms; the
refusal to start because one max_model_len request does not fit the KV cache is read with the memory ledger
(`start_readings.kv_refusal`), which uses `derived_max_len` here. Pure.
"""

from __future__ import annotations

import math

from sidecar.doctor import formula
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import tokens
from sidecar.doctor.histogram import GENERATION_TOKENS, MAX_TOKENS_PARAM, PROMPT_TOKENS, Histogram
from sidecar.doctor.logfacts import Refusal
from sidecar.doctor.setup import Setup
from sidecar.model.text import plural

MIN_REQUESTS = 50  # fewer finished requests are too thin a sample for a p99
BLOWOUT_RATIO = 2.0  # max_model_len at least this many times what p99 traffic needs
DEFAULT_BLOCK_SIZE = 16
PRESSURE_KV_USAGE = 0.8  # KV usage from here on is pressure a shorter max_model_len could relieve


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
    harm = kv_pressure(evidence)
    if harm is None:
        return None  # a long limit nobody uses costs nothing until long requests crowd the KV cache
    lines = [
        f"max_model_len {tokens(limit.value)} ({limit.source})",
        f"p99 prompt {describe_bucket(traffic.prompt, 0.99)} tokens, p99 output "
        f"{describe_bucket(traffic.generation, 0.99)} tokens over "
        f"{plural(traffic.requests, 'finished request', spec=',')} ({PROMPT_TOKENS}, {GENERATION_TOKENS})",
        f"max_model_len is {limit.value / computed.value:.1f}x what p99 traffic needs ({computed.value})",
    ]
    pool = setup.kv_pool_tokens
    if pool is not None and pool.value > 0:
        lines.append(
            f"one max_model_len request can take {min(1.0, limit.value / pool.value):.0%} of the KV pool "
            f"({tokens(pool.value)} tokens, {pool.source})"
        )
    lines.append(f"and the KV cache is under pressure: {harm}")
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


def kv_pressure(evidence: Evidence) -> str | None:
    """Evidence that long requests can hurt: preemptions, requests waiting, a KV cache near full, or the
    sidecar's pauses for KV pressure; None on a server that shows none (a short limit would only refuse
    longer prompts there)."""
    reading = evidence.live.reading
    said: list[str] = []
    if reading is not None:
        preemptions = sum(engine.preemptions_total or 0.0 for engine in reading.engines)
        waiting = sum(engine.requests_waiting or 0.0 for engine in reading.engines)
        usage = max((engine.kv_cache_usage_ratio or 0.0 for engine in reading.engines), default=0.0)
        if preemptions > 0:
            said.append(
                f"{plural(preemptions, 'preemption', spec=',.0f')} since vLLM started (vllm:num_preemptions_total)"
            )
        if waiting > 0:
            said.append(f"{plural(waiting, 'request', spec=',.0f')} waiting now (vllm:num_requests_waiting)")
        if usage >= PRESSURE_KV_USAGE:
            said.append(f"KV cache {usage:.0%} used now")
    history = evidence.history
    if history is not None and history.policy is not None:
        paused = [
            e for e in history.policy["recent"] if "pause_admission" in e["actions"] and "KV cache" in e["reason"]
        ]
        if paused:
            said.append(f"the sidecar paused admission {plural(len(paused), 'time')} for KV cache usage")
    return "; ".join(said) or None


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
        # From the numbers as printed, at the ends of their rounding that make the fewest tokens fit.
        error = refusal.printed_half_unit_gib
        available, needed = refusal.available_gib - error, refusal.needed_gib + error
        return max(0, math.floor(refusal.max_model_len * available / needed))
    return None
