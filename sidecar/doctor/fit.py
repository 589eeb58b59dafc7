"""Does not fit, live: the pool holds fewer than two p99 requests while vLLM already takes 90 % of the card.

The ways out are more GPUs or an fp8 KV cache. From a log, the same cause is read with the memory ledger
(`log_memory`, `kv_room.no_kv_room`). Pure.
"""

from __future__ import annotations

from sidecar.doctor.blowout import MIN_REQUESTS
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import tokens
from sidecar.doctor.setup import Setup

MIN_P99_REQUESTS = 2.0
FULL_CARD_UTILIZATION = 0.9
MAX_TENSOR_PARALLEL = 8


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
        recommendations=tuple(_remedies(setup)),
    )


def _remedies(setup: Setup) -> list[Recommendation]:
    """Live, without the weights' size: twice the GPUs, and an fp8 KV cache."""
    remedies: list[Recommendation] = []
    doubled = min(MAX_TENSOR_PARALLEL, setup.tensor_parallel_size * 2)
    if doubled > setup.tensor_parallel_size:
        remedies.append(
            Recommendation(
                flag="--tensor-parallel-size",
                value=doubled,
                why=f"{setup.tensor_parallel_size} -> {doubled} GPUs: each holds half the weights, the rest is KV",
            )
        )
    if setup.kv_cache_dtype in (None, "auto"):
        remedies.append(
            Recommendation(
                flag="--kv-cache-dtype",
                value="fp8",
                why="an fp8 KV cache holds twice the tokens of a 16-bit one in the same memory",
            )
        )
    return remedies
