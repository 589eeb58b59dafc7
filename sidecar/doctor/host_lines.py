"""The host's lines, not the accelerator's: a weights file the host would not map, the kernel's or Ray's OOM
killer, V0's swap space (too large for the host, or exhausted), and the CPU backend's KV space on a NUMA node.
Patterns and their handlers, as in `start_refusal`; `log_parser` matches each. Pure.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.log_records import NUMBER, error_text, loose
from sidecar.doctor.logfacts import CpuKvSpace, Facts, HostMemory, HostMemoryKind, Refusal, RefusalKind

# The host's memory: a file the host would not map (safetensors maps each weights file whole), the kernel's OOM
# killer as a shell, dmesg or Kubernetes reports it.
MAP_REFUSED = loose(r"unable to mmap (\d+) bytes from file .*Cannot allocate mem")
KILLED = re.compile(r"(?:^|\s)Killed\s*$|\bOOMKilled\b|Out of memory: Killed process \d+")
# Ray's memory monitor kills a task or actor when the node's memory passes its threshold (0.95 by default):
# "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."
NODE_LOW = loose(r"killed due to the node running low on memory|killed due to memory pressure \(OOM\)")
# Ray's line after the kill: "... was running was 31.27GB / 32.00GB (0.977), which exceeds the memory usage
# threshold of 0.95."
NODE_MEMORY = loose(
    r"was ([\d.]+) ?GB / ([\d.]+) ?GB \([\d.]+\), which exceeds the memory usage threshold of (\d+(?:\.\d+)?)"
)
# vLLM's CacheConfig, when --swap-space x the GPUs of the node takes over 40 % of the host's memory: "Possibly
# too large swap space. 16.00 GiB out of the 32.00 GiB total CPU memory is allocated for the swap space."
SWAP_WARNING = loose(
    r"Possibly too large swap space\. " + NUMBER + r" GiB out of the " + NUMBER + r" GiB total CPU memory"
)

# V0's scheduler, out of CPU blocks to swap a preempted group into (V1 has no swap): the engine dies of it.
SWAP_EXHAUSTED = loose(r"Aborted due to the lack of CPU swap space")

# vllm/v1/worker/cpu_worker.py (0.2x+): "Available memory on node 0 (149.11/692.65 GiB) on kv cache allocation is
# less than requested memory for kv (206.54/207.8 GiB)."
CPU_NODE = loose(
    r"Available memory on node \d+ \("
    + NUMBER
    + "/"
    + NUMBER
    + r" GiB\) on kv cache allocation is less than requested "
    r"memory for kv \(" + NUMBER + "/" + NUMBER + r" GiB\)"
)
# The CPU worker's KV space when VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes set it (cpu_worker.py, 0.25-0.32):
# "Explicitly set (0.0/11.65) GiB for KV cache on node 0."
CPU_KV_SPACE = loose(r"Explicitly set \(" + NUMBER + "/" + NUMBER + r"\) GiB for KV cache on node \d+")


def _error_line(match: re.Match[str]) -> str:
    return error_text(match, "RuntimeError:")


def cpu_node(match: re.Match[str], facts: Facts) -> None:
    available, total, requested, budget = (float(match.group(i)) for i in range(1, 5))
    facts["refusal"] = Refusal(
        kind=RefusalKind.CPU_KV_OVER_AVAILABLE,
        line=error_text(match),
        free_gib=available,
        total_gib=total,
        requested_gib=requested,
        budget_gib=budget,
    )


def cpu_kv_space(match: re.Match[str], facts: Facts) -> None:
    space, total = (float(match.group(i)) for i in (1, 2))
    facts["cpu_kv_space"] = CpuKvSpace(line=match.group(0), space_gib=space, node_total_gib=total)


def map_refused(match: re.Match[str], facts: Facts) -> None:
    facts["host_memory"] = HostMemory(
        kind=HostMemoryKind.MAP_REFUSED, line=_error_line(match), bytes=int(match.group(1))
    )


def killed(match: re.Match[str], facts: Facts) -> None:
    facts["host_memory"] = HostMemory(kind=HostMemoryKind.KILLED, line=match.string.strip())


def node_low(match: re.Match[str], facts: Facts) -> None:
    text = match.string
    line = text[text.rfind("\n", 0, match.start()) + 1 : match.end()].strip()
    facts["host_memory"] = HostMemory(kind=HostMemoryKind.NODE_LOW, line=line)


def node_memory(match: re.Match[str], facts: Facts) -> None:
    """Ray's next line says how full the node was: added to the kill it explains. Ray writes it only when it
    kills, so alone (an excerpt without the exception before it) it is the kill."""
    killed = facts.get("host_memory")
    said = f"(the node at {match.group(1)} / {match.group(2)} GB, over Ray's threshold of {match.group(3)})"
    if isinstance(killed, HostMemory) and killed.kind is HostMemoryKind.NODE_LOW:
        facts["host_memory"] = replace(killed, line=f"{killed.line} {said}")
    elif killed is None:
        facts["host_memory"] = HostMemory(
            kind=HostMemoryKind.NODE_LOW, line=f"Ray's memory monitor killed a task {said}"
        )


def swap_warning(match: re.Match[str], facts: Facts) -> None:
    facts["swap_gib"], facts["host_total_gib"] = float(match.group(1)), float(match.group(2))


def swap_exhausted(_: re.Match[str], facts: Facts) -> None:
    facts["swap_exhausted"] = True
    facts["engine"] = "v0"  # only V0 swaps
    facts.setdefault("preemption_mode", "SWAP")
