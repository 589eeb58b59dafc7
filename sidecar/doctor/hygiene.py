"""Findings outside the four OOM causes (`other`): prefix caching that does not pay, no drain on SIGTERM, and
a block size too coarse for widely varying request lengths. Pure.
"""

from __future__ import annotations

from sidecar.doctor import formula
from sidecar.doctor.blowout import MIN_REQUESTS
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import ratio, tokens
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import at_least, available

PREFIX_HIT_THRESHOLD = 0.30
SMALL_BLOCK_SIZE = 16  # vLLM's CUDA default
WIDE_SPREAD = 4.0  # p99 / p50 request length
BLOCK_WASTE_RATIO = 0.05  # the half-empty last block as a share of the median request


def prefix_caching(evidence: Evidence, setup: Setup) -> Finding | None:
    enabled = setup.prefix_caching
    traffic = evidence.live.traffic
    if enabled is None or not enabled.value or traffic is None or traffic.requests < MIN_REQUESTS:
        return None
    measured = _hit_ratio(evidence)
    if measured is None or measured[0] >= PREFIX_HIT_THRESHOLD:
        return None
    hit_ratio, how = measured
    lines = [
        f"prefix caching is on ({enabled.source})",
        f"prefix-cache hit ratio {ratio(hit_ratio)} ({how}) < {PREFIX_HIT_THRESHOLD:.0%}",
    ]
    recommendations: list[Recommendation] = []
    if available("--no-enable-prefix-caching", setup.version):
        recommendations.append(
            Recommendation(
                flag="--no-enable-prefix-caching",
                value="",
                why=(
                    f"{ratio(hit_ratio)} of prompt tokens hit: hashing every block and keeping evictable blocks "
                    "costs more than the reuse saves below 30 %"
                ),
            )
        )
    else:
        lines.append("this vLLM has prefix caching off by default: drop --enable-prefix-caching from its command")
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.INFO,
        summary=f"prefix caching does not pay: {ratio(hit_ratio)} of prompt tokens hit the cache",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _hit_ratio(evidence: Evidence) -> tuple[float, str] | None:
    history = evidence.history
    if history is not None and history.prefix_hit_ratio_window is not None:
        return history.prefix_hit_ratio_window, f"over the sidecar's window, {history.source}"
    reading = evidence.live.reading
    if reading is None:
        return None
    queries = sum(engine.prefix_cache_queries_total or 0.0 for engine in reading.engines)
    hits = sum(engine.prefix_cache_hits_total or 0.0 for engine in reading.engines)
    if queries > 0:
        return hits / queries, f"{tokens(hits)} hits / {tokens(queries)} queried tokens since vLLM started"
    gauges = [e.prefix_cache_hit_rate_gauge for e in reading.engines if e.prefix_cache_hit_rate_gauge is not None]
    if gauges and min(gauges) >= 0:
        return min(gauges), "vllm:gpu_prefix_cache_hit_rate"
    return None


def shutdown(evidence: Evidence, setup: Setup) -> Finding | None:
    """vLLM >= 0.18 drains in-flight requests on SIGTERM only with --shutdown-timeout > 0 (default 0: abort)."""
    current = setup.shutdown_timeout
    if not at_least(setup.version, (0, 18, 0)) or current is None or current.value > 0:
        return None
    traffic = evidence.live.traffic
    latency = traffic.e2e_latency if traffic is not None and traffic.requests >= MIN_REQUESTS else None
    p99 = latency.percentile_upper(0.99) if latency is not None else None
    timeout = formula.shutdown_timeout(p99, latency.count if latency is not None else 0)
    grace = formula.grace_period(int(timeout.value))
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.INFO,
        summary="a restart or rollout aborts every in-flight request: vLLM is not told to drain on SIGTERM",
        evidence=(
            f"vLLM {setup.version_text} has --shutdown-timeout; it is {current.value} ({current.source}): "
            "0 aborts in-flight requests",
        ),
        recommendations=(
            Recommendation(flag="--shutdown-timeout", value=timeout.value, why=timeout.why),
            Recommendation(
                flag="terminationGracePeriodSeconds",
                value=grace.value,
                why=f"the pod's grace period must outlast the drain, or the kubelet kills vLLM mid-drain: {grace.why}",
            ),
        ),
    )


def block_size(evidence: Evidence, setup: Setup) -> Finding | None:
    """Large blocks waste their half-empty last block on every short request when lengths vary widely."""
    block = setup.block_size
    traffic = evidence.live.traffic
    if block is None or block.value <= SMALL_BLOCK_SIZE or setup.device == "cpu" or traffic is None:
        return None
    if traffic.requests < MIN_REQUESTS:
        return None
    p50 = _total(traffic.prompt.percentile_upper(0.5), traffic.generation.percentile_upper(0.5))
    p99 = _total(traffic.prompt.percentile_upper(0.99), traffic.generation.percentile_upper(0.99))
    mean = traffic.mean_tokens
    if p50 is None or p99 is None or mean is None or p50 <= 0 or mean <= 0:
        return None
    waste = (block.value - 1) / 2 / mean
    if p99 / p50 < WIDE_SPREAD or waste < BLOCK_WASTE_RATIO:
        return None
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.INFO,
        summary=f"block size {block.value} wastes KV memory on short requests",
        evidence=(
            f"block_size {block.value} ({block.source})",
            f"request length p50 <= {tokens(p50)}, p99 <= {tokens(p99)} tokens: {p99 / p50:.1f}x spread",
            f"the half-empty last block is {(block.value - 1) / 2:.1f} tokens, {waste:.1%} of the mean request "
            f"({mean:,.1f} tokens)",
        ),
        recommendations=(
            Recommendation(
                flag="--block-size",
                value=SMALL_BLOCK_SIZE,
                why=f"waste per request falls to {(SMALL_BLOCK_SIZE - 1) / 2:.1f} tokens "
                f"({(SMALL_BLOCK_SIZE - 1) / 2 / mean:.1%} of the mean request)",
            ),
        ),
    )


def _total(prompt: float | None, output: float | None) -> float | None:
    return None if prompt is None or output is None else prompt + output
