"""How vLLM states its memory at start: the memory profile (the budget, the weights, the activation peak, non-torch
memory, what is left for the KV cache) as V0, V1 and hardware plugins word it; the KV cache's size in blocks and
tokens; CUDA graphs' memory. Patterns and their handlers, as in `start_refusal`; `log_parser` matches each. Pure.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.log_records import NUMBER, loose
from sidecar.doctor.logfacts import Facts, MemoryProfile

INTEGER = r"([\d,]+)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


FREE_INFO = loose(
    (
        r"Free memory on device(?: \S+)? \({n}/{n} GiB\) on startup\. Desired GPU memory utilization is \({n}, {n} "
        r"GiB\)\. Actual usage is {n} GiB for weight, {n} GiB for peak activation, {n} GiB for non-torch memory, and "
        r"{n} GiB for CUDAGraph memory"
    ).replace("{n}", NUMBER)
)
V0_BUDGET = loose(
    r"total_gpu_memory \(" + NUMBER + r" ?GiB\) x gpu_memory_utilization \(" + NUMBER + r"\) = " + NUMBER + r" ?GiB"
)
V0_PROFILE = loose(
    r"model weights take " + NUMBER + r" ?GiB; non_torch_memory takes " + NUMBER + r" ?GiB; PyTorch activation peak "
    r"memory takes " + NUMBER + r" ?GiB;\s*the rest of the memory reserved for KV Cache is " + NUMBER + r" ?GiB"
)  # `\s*`: a paste that wrapped the line at that space dropped it
KV_TOKENS = loose(r"\b[A-Z]+(?: \+ host)? KV cache size: " + INTEGER + r" tokens")
CONCURRENCY = loose(r"Maximum concurrency for " + INTEGER + r" tokens per request: " + NUMBER + "x")
BLOCKS = loose(r"# (?:GPU|\w+) blocks: (-?\d+)|num_gpu_blocks is: (-?\d+)")
CPU_BLOCKS = loose(r"# CPU blocks: (\d+)")
AVAILABLE_KV = loose(r"Available KV cache memory: " + NUMBER + " GiB")
# Hardware plugins' workers (vllm-ascend's worker_v1.py) state the same in bytes, clamped at 0, with the card's
# total: "Available memory: 0, total memory: 65452113920". 0 means the budget is at or below weights + peak.
AVAILABLE_BYTES = loose(r"Available memory: (\d+), total memory: (\d+)")
WEIGHTS = loose(r"(?:Model loading took|Loading model weights took) " + NUMBER + r" (GiB|GB)")
GRAPHS_PROFILED = loose(r"Profiling CUDA graph memory")
# 0.21+ (gpu_worker.py): "CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=0.3000 is equivalent to --gpu-memory-utilization=0.0201 without CUDA graph memory
# profiling. ...": graphs are charged to the budget, and the line states the budget.
GRAPHS_CHARGED = loose(r"The current --gpu-memory-utilization=" + NUMBER + r" is equivalent to")
GRAPHS = loose(r"Graph capturing finished in \d+ secs, took " + NUMBER + " GiB")
GRAPH_ESTIMATE = loose(r"Estimated CUDA graph memory: " + NUMBER + " GiB total")


def free_info(match: re.Match[str], facts: Facts) -> None:
    free, total, utilization, budget, weights, activation, non_torch, graphs = (
        float(match.group(i)) for i in range(1, 9)
    )
    facts["profile"] = MemoryProfile(
        total_gib=total,
        utilization=utilization,
        budget_gib=budget,
        weights_gib=weights,
        activation_gib=activation,
        non_torch_gib=non_torch,
        cudagraph_gib=graphs,
        free_gib=free,
    )
    facts["weights_gib"] = weights


def v0_budget(match: re.Match[str], facts: Facts) -> None:
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    total, utilization, budget = (float(match.group(i)) for i in range(1, 4))
    facts["profile"] = replace(base, total_gib=total, utilization=utilization, budget_gib=budget)
    if facts.get("engine") != "v1":  # only V0's worker (vllm/worker/worker.py) words its budget so
        facts["engine"] = "v0"


def v0_profile(match: re.Match[str], facts: Facts) -> None:
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    weights, non_torch, activation, kv = (float(match.group(i)) for i in range(1, 5))
    facts["profile"] = replace(base, weights_gib=weights, non_torch_gib=non_torch, activation_gib=activation, kv_gib=kv)
    facts["weights_gib"] = weights
    facts["available_kv_gib"] = kv


def model_loading(match: re.Match[str], facts: Facts) -> None:
    # vLLM <= 0.8.0 printed "GB" for a value it had divided by 2**30: both spellings are GiB.
    facts["weights_gib"] = float(match.group(1))


def available_kv(match: re.Match[str], facts: Facts) -> None:
    # Each rank prints its own; V1's engine sizes the KV cache of every rank by the least of them, so a rank whose
    # card holds something else fails the start however much room the others have.
    kv = float(match.group(1))
    least, most = facts.get("available_kv_gib"), facts.get("available_kv_max_gib")
    facts["available_kv_gib"] = min(kv, least) if isinstance(least, float) else kv
    facts["available_kv_max_gib"] = max(kv, most) if isinstance(most, float) else kv


def available_bytes(match: re.Match[str], facts: Facts) -> None:
    available, total = (int(match.group(i)) for i in (1, 2))
    if total <= 0:
        return
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    facts["profile"] = replace(base, total_gib=base.total_gib or total / 2**30)
    facts["available_kv_gib"] = available / 2**30


def blocks(match: re.Match[str], facts: Facts) -> None:
    # vLLM 0.1 printed a budget short of the profile's peak as a negative count ("# GPU blocks: -1") and went on to
    # fail later: no block at all, as 0 says to every reading.
    facts["num_gpu_blocks"] = max(0, int(match.group(1) or match.group(2)))


def concurrency(match: re.Match[str], facts: Facts) -> None:
    facts["concurrency"] = (int(number(match.group(1))), float(match.group(2)))


def graphs_profiled(_: re.Match[str], facts: Facts) -> None:
    facts["graphs_profiled"] = True


def graphs_charged(match: re.Match[str], facts: Facts) -> None:
    facts["graphs_profiled"] = True
    facts["graphs_charged_utilization"] = number(match.group(1))
