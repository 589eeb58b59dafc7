"""An out-of-memory error while vLLM profiles its CUDA graphs' memory, before it sizes the KV cache. Pure.

vLLM 0.20 and later measure the graphs inside the memory profile (`gpu_worker.determine_available_memory` ->
`gpu_model_runner.profile_cudagraph_memory`): a minimal KV cache of one block per captured batch slot
(`max_cudagraph_capture_size` blocks, `_init_minimal_kv_cache_for_profiling`), then a capture or two per mode.
It all runs before `--gpu-memory-utilization` is applied, so a lower budget frees nothing for it (and leaves the
KV cache less); what shrinks it is fewer captured sizes (fewer minimal blocks, smaller graphs) or no graphs at
all, which skips the profiling.
"""

from __future__ import annotations

from sidecar.doctor.capture_sizes import fewer_or_no_graphs
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.phase import RAN_OUT
from sidecar.doctor.setup import Setup

_NOT_THE_BUDGET = (
    "gpu_memory_utilization does not cap this step: vLLM profiles its graphs before it sizes the KV cache by the "
    "budget, so a lower budget frees nothing for it"
)


def graph_profiling(setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    """Fewer captured sizes, or no graphs: what the profiling allocates falls with them."""
    recommendations = fewer_or_no_graphs(
        setup, log, lines, eager_why="or no CUDA graphs at all: vLLM then skips this profiling (decoding runs slower)"
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=(
            f"{RAN_OUT} while profiling CUDA graphs' memory, before the KV cache: the minimal KV cache and the "
            "captures vLLM measures did not fit beside the weights and the profile run"
        ),
        evidence=(*lines, _NOT_THE_BUDGET),
        recommendations=tuple(recommendations),
        steps=()
        if recommendations
        else ("capture fewer batch sizes (--max-cudagraph-capture-size), or run with --enforce-eager",),
    )
