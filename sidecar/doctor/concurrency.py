"""Concurrency misjudgement: max_num_seqs admits more requests than the KV pool holds at real request sizes.

The scheduler then preempts (recomputes) requests whenever decoding needs a block, and queues the rest. The
pool's size is vLLM's own (`cache_config_info`), the request size the mean prompt + output of its token
histograms, max_num_seqs comes from the arguments it logged. Pure.
"""

from __future__ import annotations

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
