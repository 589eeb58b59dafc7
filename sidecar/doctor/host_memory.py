"""The host's memory gave out, not the accelerator's: a weights file the host would not map, a process the kernel's
OOM killer ended. Pure.

No GPU flag changes either; the one vLLM flag that takes host memory at start is V0's `--swap-space` (pinned host
memory per GPU for swapped-out KV blocks, 4 GiB by default), allocated right after the `# CPU blocks` line;
vLLM warns when it takes over 40 % of the host ("Possibly too large swap space"). Ray's memory monitor kills a
worker before the kernel would, once the node's memory passes its threshold.
"""

from __future__ import annotations

from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.logfacts import HostMemory, HostMemoryKind, LogFacts

DEFAULT_SWAP_SPACE_GIB = 4.0  # V0's --swap-space
SMALLER_SWAP_SPACE_GIB = 1  # keeps swapping possible (beam search, n > 1) with a quarter of the default
_CONFIRM = (
    "confirm it was the OOM killer: `dmesg | grep -i 'killed process'` on the host, or `kubectl describe pod` "
    "(Last State: OOMKilled); a SIGKILL from elsewhere (a stop that timed out) reads the same here"
)
_CONFIRM_RAY = (
    "Ray's message lists the node's memory and its top consumers; `ray memory` and the raylet's log say more. Each "
    "worker holds the model's weights in host memory while it loads: fewer workers per node, or a node with more "
    "memory, is the way out; RAY_memory_usage_threshold (0.95 by default) only moves the line"
)
_HOST_NEEDS = (
    "the container's memory limit (or the host's RAM) must hold vLLM's host memory: a few GiB per process, each "
    "weights file mapped while it loads, V0's --swap-space per GPU and any --cpu-offload-gb"
)
_SHARED_MEMORY = (
    "on a board whose CPU and GPU share one memory (Jetson, DGX Spark) vLLM's GPU budget is host memory too: "
    "a lower --gpu-memory-utilization leaves the rest of the system its share"
)


def host_memory_finding(host: HostMemory, log: LogFacts) -> Finding:
    if host.kind is HostMemoryKind.MAP_REFUSED:
        return _map_refused(host)
    return _killed(host, log)


def _map_refused(host: HostMemory) -> Finding:
    size = gib(host.bytes or 0)
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.CRITICAL,
        summary=f"the host refused to map a {size} weights file into memory (ENOMEM): host memory, not the GPU's",
        evidence=(
            f"while loading: {host.line}",
            "loading maps each safetensors file whole into the process's address space before any of it reaches "
            "the GPU: the container's memory limit (or the host's overcommit or address-space limit) is below it",
        ),
        steps=(
            f"raise the container's memory limit above the largest weights file ({size}) plus vLLM's own few GiB, "
            "or use a checkpoint saved in smaller shards",
            "no GPU flag changes this: the weights had not reached the GPU",
        ),
    )


def _killed(host: HostMemory, log: LogFacts) -> Finding:
    by_ray = host.kind is HostMemoryKind.NODE_LOW
    lines = [
        f"Ray's memory monitor killed vLLM's task ({host.line!r}): the node's memory passed Ray's threshold"
        if by_ray
        else f"the process was killed ({host.line!r}): the kernel's OOM killer ends a process when the host's or "
        "the container's memory runs out"
    ]
    recommendations: list[Recommendation] = []
    swap = log.args.swap_space if log.args is not None else None
    if log.swap_gib is not None and log.host_total_gib:
        lines.append(
            f"vLLM warned that its swap space takes {log.swap_gib:g} GiB of the host's {log.host_total_gib:g} GiB "
            "(--swap-space x the GPUs on the node, pinned host memory)"
        )
    if log.cpu_blocks or log.swap_gib is not None:
        swap_gib = swap if swap is not None else DEFAULT_SWAP_SPACE_GIB
        stated = "the arguments vLLM logged" if swap is not None else "V0's default, not in the log: assumed"
        if log.cpu_blocks:
            lines.append(
                f"vLLM had just sized {log.cpu_blocks:,} CPU blocks: --swap-space {swap_gib:g} GiB per GPU "
                f"({stated}) of pinned host memory, allocated next"
            )
        if swap_gib > SMALLER_SWAP_SPACE_GIB:
            recommendations.append(
                Recommendation(
                    flag="--swap-space",
                    value=SMALLER_SWAP_SPACE_GIB,
                    why=(
                        f"{swap_gib:g} GiB of pinned host memory per GPU -> {SMALLER_SWAP_SPACE_GIB} GiB gives "
                        f"{swap_gib - SMALLER_SWAP_SPACE_GIB:g} GiB back to the host; preempted requests are "
                        "recomputed instead of swapped"
                    ),
                )
            )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT if recommendations else Cause.OTHER,
        severity=Severity.CRITICAL,
        summary=(
            "Ray killed vLLM's worker for the node's memory: the host's memory ran out, not the GPU's"
            if by_ray
            else "vLLM was killed, most likely by the kernel's OOM killer: the host's memory ran out, not the GPU's"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=(_CONFIRM_RAY if by_ray else _CONFIRM, _HOST_NEEDS, _SHARED_MEMORY),
    )
