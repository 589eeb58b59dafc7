"""Concurrency misjudgement: max_num_seqs admits more requests than the KV pool holds at real request sizes.

The scheduler then preempts (recomputes) requests whenever decoding needs a block, and queues the rest. The
pool's size is vLLM's own (`cache_config_info`), the request size the mean prompt + output of its token
histograms, max_num_seqs comes from the arguments it logged. Pure.
"""

from __future__ import annotations

import math

from sidecar.doctor import formula
from sidecar.doctor.blowout import MIN_REQUESTS
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import tokens
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import available

CONCURRENCY_RATIO = 1.5  # max_num_seqs at least this many times what the pool holds


def live_concurrency(evidence: Evidence, setup: Setup) -> Finding | None:
    reading = evidence.live.reading
    traffic = evidence.live.traffic
    pool = setup.kv_pool_tokens
    if reading is None or traffic is None or pool is None or pool.value <= 0 or traffic.requests < MIN_REQUESTS:
        return None
    mean = traffic.mean_tokens
    if mean is None or mean <= 0:
        return None
    preemptions = sum(engine.preemptions_total or 0.0 for engine in reading.engines)
    waiting = sum(engine.requests_waiting or 0.0 for engine in reading.engines)
    seqs = setup.max_num_seqs
    holds = pool.value / mean
    too_many = seqs is not None and seqs.value >= CONCURRENCY_RATIO * holds
    if preemptions <= 0 and not too_many:
        return None
    computed = formula.max_num_seqs(pool.value, mean, traffic.requests)
    if seqs is not None and computed.value >= seqs.value:
        return None  # max_num_seqs is not what overfills the pool
    lines = [
        f"KV pool {tokens(pool.value)} tokens per engine ({pool.source})",
        f"mean request {mean:,.1f} tokens: prompt {traffic.prompt.mean or 0:,.1f} + output "
        f"{traffic.generation.mean or 0:,.1f} ({traffic.requests:,} finished requests)",
        f"the pool holds {holds:,.1f} such requests at once",
    ]
    if seqs is not None:
        lines.append(
            f"max_num_seqs {seqs.value} ({seqs.source}) x {mean:,.1f} = {tokens(seqs.value * mean)} tokens, "
            f"{seqs.value * mean / pool.value:.1f}x the pool"
        )
    else:
        lines.append("max_num_seqs unknown (give --vllm-log with vLLM's start lines to see it)")
    if preemptions > 0:
        lines.append(f"vLLM preempted requests {preemptions:,.0f} times since it started (vllm:num_preemptions_total)")
    if waiting > 0:
        lines.append(f"{waiting:,.0f} requests waiting now (vllm:num_requests_waiting)")
    recommendations = [Recommendation(flag="--max-num-seqs", value=computed.value, why=computed.why)]
    if (preemptions > 0 or waiting > 0) and available("--max-num-queued-reqs", setup.version):
        recommendations.append(
            Recommendation(
                flag="--max-num-queued-reqs",
                value=computed.value,
                why=(
                    f"one more batch ({computed.value}) may wait; beyond that vLLM answers HTTP 503 so load balancers "
                    "retry elsewhere instead of queueing behind preemptions"
                ),
            )
        )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=f"more requests are admitted than the KV pool holds at real sizes ({holds:,.1f})",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def log_concurrency(evidence: Evidence, setup: Setup) -> Finding | None:
    """vLLM's own preemption warnings (V0: `... is preempted by PreemptionMode.X ... total_num_cumulative_preemption
    =N`): more requests ran than the KV cache holds. The stats line with the highest KV usage says how many
    requests filled it, which sizes max_num_seqs: running / usage x 90 %."""
    log = evidence.log
    if log is None or not log.preemptions:
        return None
    mode = log.preemption_mode or "an unknown"
    lines = [f"vLLM preempted requests {log.preemptions:,} times (its warning, {mode} mode): the KV cache ran out"]
    recommendations: list[Recommendation] = []
    busiest = log.busiest
    if busiest is not None and busiest.kv_usage > 0 and busiest.running > 0:
        holds = busiest.running / busiest.kv_usage
        swapped = f", {busiest.swapped} swapped out" if busiest.swapped else ""
        lines.append(
            f"at the fullest stats line {busiest.running} running requests{swapped} and {busiest.waiting:,} waiting "
            f"filled {busiest.kv_usage:.1%} of the KV cache: it holds about {busiest.running} / {busiest.kv_usage:.3f} "
            f"= {holds:,.1f} requests of today's size"
        )
        value = max(1, math.floor(holds * formula.KV_HEADROOM_RATIO))
        seqs = setup.max_num_seqs
        if seqs is None or value < seqs.value:
            now = f"now {seqs.value} ({seqs.source})" if seqs is not None else "now not in the log"
            recommendations.append(
                Recommendation(
                    flag="--max-num-seqs",
                    value=value,
                    why=(
                        f"{holds:,.1f} requests fit x {formula.KV_HEADROOM_RATIO:g} headroom = "
                        f"{holds * formula.KV_HEADROOM_RATIO:,.2f}, rounded down -> {value} ({now}): the rest wait "
                        "in the queue instead of being preempted and recomputed"
                    ),
                )
            )
            if available("--max-num-queued-reqs", setup.version):
                recommendations.append(
                    Recommendation(
                        flag="--max-num-queued-reqs",
                        value=value,
                        why=f"one more batch ({value}) may wait; beyond that vLLM answers HTTP 503 (load shedding)",
                    )
                )
    else:
        lines.append("no stats line (Running: ... GPU KV cache usage: ...) in the log: max_num_seqs cannot be sized")
    lines.append(
        "or give the KV cache more room: --kv-cache-dtype fp8 (twice the tokens), a higher gpu_memory_utilization "
        "where the card has it free, or more GPUs"
    )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=f"vLLM preempted requests {log.preemptions:,} times: more run at once than its KV cache holds",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )
