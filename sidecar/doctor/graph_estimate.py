"""A negative CUDA-graph memory estimate: vLLM (0.18+) takes its estimate of the graphs' memory out of the KV
cache's share of the budget ("Estimated CUDA graph memory: X GiB total"); an estimate below zero (seen with
speculative decoding's graphs on a unified-memory board) gave the KV cache that much more than the budget holds,
so the card runs out once the graphs and the cache are both there."""

from __future__ import annotations

from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.ledger import MemoryLedger

# Below this the estimate's sign is noise in its rounding; a real overcount is whole GiB.
NEGATIVE_ESTIMATE_GIB = -0.5


def negative_graph_estimate(estimate_gib: float, ledger: MemoryLedger, also: tuple[str, ...]) -> Finding:
    overcount = -estimate_gib
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM estimated its CUDA graphs at {estimate_gib:.2f} GiB: the KV cache was sized {overcount:.2f} GiB "
            "beyond the budget"
        ),
        evidence=(
            f"Estimated CUDA graph memory: {estimate_gib:.2f} GiB: vLLM subtracts this estimate from the KV "
            f"cache's share, so a negative one adds {overcount:.2f} GiB the budget does not have",
            *also,
            *ledger.lines(),
        ),
        recommendations=(
            Recommendation(
                flag="--enforce-eager",
                value="",
                why="no CUDA graphs: nothing is estimated, and the KV cache gets the budget's share and no more",
            ),
        ),
        steps=(
            "or keep the graphs and turn the estimate off (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0), or lower "
            f"--gpu-memory-utilization by {overcount:.2f} GiB over the card's memory, which the estimate added",
        ),
    )
