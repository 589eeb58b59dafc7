"""Configuration overshoot read from a log: a V1 start refused for lack of free memory, or a CUDA OOM.

Says which flag to change and to what, by the phase the OOM hit: during CUDA-graph capture (lower the
utilisation by the shortfall, or run eager), during the profile run (a smaller dummy batch), or while serving
(another tenant, or vLLM beyond its budget). Pure.
"""

from __future__ import annotations

import json
from dataclasses import replace

from sidecar.doctor import formula
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase, Refusal, RefusalKind
from sidecar.doctor.overshoot import allocator_fragmentation
from sidecar.doctor.setup import DEFAULT_UTILIZATION, Setup
from sidecar.doctor.versions import graph_sizes_flag

MIN_BATCHED_TOKENS = 256
MIN_USEFUL_UTILIZATION = 0.1  # below this share of the card, lowering the budget is not a way out
SAMPLER_UTILIZATION_STEP = 0.02  # what to give up for the sampler's peak when max_num_seqs stays
MAX_TENSOR_PARALLEL = 8
TARGET_WEIGHT_SHARE = 0.75  # weights may take at most this much of each GPU after a remedy
GRAPH_SIZE_CAP = 512  # vLLM's cap on its default largest capture size (V1, every release read)
MIN_CAPTURE_SIZE = 8  # below this a cap saves next to nothing: say --enforce-eager instead


def log_overshoot(log: LogFacts | None, setup: Setup) -> Finding | None:
    if log is None:
        return None
    if log.refusal is not None and log.refusal.kind is RefusalKind.INSUFFICIENT_FREE_MEMORY:
        return _free_memory_refusal(log.refusal)
    if log.refusal is not None and log.refusal.kind is RefusalKind.SAMPLER_WARMUP:
        return _sampler_warmup(log.refusal, setup)
    if log.oom is not None:
        finding = _oom(log.oom, setup, log)
        if finding is not None and log.engine_dead:
            # The OOM killed the engine: every request in flight failed and vLLM had to be restarted.
            finding = replace(
                finding,
                summary=finding.summary
                if "died of" in finding.summary
                else f"{finding.summary}; vLLM's engine died of it",
                evidence=(
                    *finding.evidence,
                    "the engine died of this error: the log then says the engine is dead (EngineDeadError or "
                    "'Engine core proc ... died'): every request in flight failed and vLLM had to be restarted",
                ),
            )
        return finding
    return None


def _assumed_utilization(setup: Setup) -> tuple[float, str]:
    """gpu_memory_utilization and where it comes from; vLLM's default when the log does not say."""
    utilization = setup.gpu_memory_utilization
    if utilization is not None:
        return utilization.value, utilization.source
    return DEFAULT_UTILIZATION, f"not in the log: vLLM's default {DEFAULT_UTILIZATION:g} assumed"


def _sampler_warmup(refusal: Refusal, setup: Setup) -> Finding:
    dummy = refusal.dummy_requests or 0
    lines = [f"vLLM could not start: {refusal.line}"]
    recommendations: list[Recommendation] = []
    if dummy > 1:
        halved = dummy // 2
        recommendations.append(
            Recommendation(
                flag="--max-num-seqs",
                value=halved,
                why=(
                    f"the sampler warm-up runs max_num_seqs = {dummy} dummy requests at once and its logits did not "
                    f"fit; halving it halves that peak: {dummy} / 2 -> {halved} (vLLM's own message names this flag)"
                ),
            )
        )
    value, source = _assumed_utilization(setup)
    lowered = formula.floor_hundredths(value - SAMPLER_UTILIZATION_STEP)
    recommendations.append(
        Recommendation(
            flag="--gpu-memory-utilization",
            value=lowered,
            why=(
                f"or keep max_num_seqs and leave the warm-up more room: {value:g} ({source}) - "
                f"{SAMPLER_UTILIZATION_STEP:g} -> {lowered:.2f} (the KV cache shrinks by that share of the card)"
            ),
        )
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"vLLM ran out of memory warming up its sampler with {dummy} dummy requests (max_num_seqs)",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _free_memory_refusal(refusal: Refusal) -> Finding:
    free = (refusal.free_gib or 0.0) * GIB
    total = (refusal.total_gib or 0.0) * GIB
    lines = [
        f"vLLM refused to start: {refusal.line}",
        f"free at start {gib(free)} of {gib(total)}; gpu_memory_utilization {refusal.utilization:g} asks for "
        f"{refusal.requested_gib:.2f} GiB: {gib(total - free)} is held by other processes (or a previous vLLM)",
    ]
    recommendations: list[Recommendation] = []
    if total > 0:
        computed = formula.utilization(int(total), int(total - free), 0)
        if computed.value >= MIN_USEFUL_UTILIZATION:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
        else:
            lines.append(
                f"what is left would be gpu_memory_utilization {computed.value:.2f}, too little to serve: free the GPU "
                "first (a previous vLLM still exiting, another job), or move vLLM to another GPU"
            )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not start: the card has less free memory than gpu_memory_utilization asks for",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _oom(oom: CudaOom, setup: Setup, log: LogFacts) -> Finding | None:
    total = oom.total_bytes
    lines = [_oom_line(oom)]
    lines.extend(f"another process on the GPU: pid {pid} holds {gib(size)}" for pid, size in oom.other_processes)
    if oom.phase is OomPhase.WEIGHT_LOADING:
        return _weights_do_not_fit(oom, setup, lines)
    if oom.phase is OomPhase.GRAPH_CAPTURE:
        return _graph_capture(oom, setup, lines, log)
    if oom.phase is OomPhase.PROFILING:
        return _profiling(oom, setup, lines)
    fragmented = (
        allocator_fragmentation(
            reserved_unallocated_bytes=oom.reserved_unallocated_bytes,
            failed_allocation_bytes=oom.tried_bytes,
            total_bytes=total,
            free_bytes=oom.free_bytes or 0,
            where=f"CUDA out of memory while {_phase_text(oom.phase)}",
        )
        if oom.reserved_unallocated_bytes is not None
        else None
    )
    others = sum(size for _, size in oom.other_processes)
    if fragmented is not None and not others:
        return fragmented  # nobody else took the memory: the allocator stranded it
    recommendations: list[Recommendation] = []
    if others and total:
        computed = formula.utilization(total, others, 0)
        known = setup.gpu_memory_utilization
        if known is not None and computed.value < known.value:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
        if fragmented is not None:
            lines.extend(fragmented.evidence[1:])
            recommendations.extend(fragmented.recommendations)
    elif total:
        value, source = _assumed_utilization(setup)
        shortfall = max(0, oom.tried_bytes - (oom.free_bytes or 0))
        if oom.process_bytes is not None:
            budget = int(value * total)
            lines.append(
                f"vLLM's budget: gpu_memory_utilization {value:g} ({source}) x {gib(total)} = {gib(budget)}; "
                f"its process held {gib(oom.process_bytes)}"
            )
        computed = formula.utilization_for_transient(value, source, oom.tried_bytes, shortfall, total)
        recommendations.append(Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why))
        recommendations.extend(_batched_tokens(setup))
    if not recommendations:
        return None
    cause = "another process took the memory" if others else "a transient vLLM did not budget for"
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"vLLM died of a CUDA out-of-memory error while {_phase_text(oom.phase)}: {cause}",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _batched_tokens(setup: Setup) -> list[Recommendation]:
    """A prefill's activations grow with the tokens of one step: cap them when the log says how many."""
    current = setup.max_num_batched_tokens
    if current is None or current.value <= 2 * MIN_BATCHED_TOKENS * 4:
        return []
    halved = current.value // 2 // MIN_BATCHED_TOKENS * MIN_BATCHED_TOKENS
    return [
        Recommendation(
            flag="--max-num-batched-tokens",
            value=halved,
            why=(
                f"or keep the budget and shrink the peak: a step's activations grow with its tokens; "
                f"{current.value} ({current.source}) halved to a multiple of {MIN_BATCHED_TOKENS} -> {halved} "
                "(long prompts are then prefilled in chunks)"
            ),
        )
    ]


def _weights_do_not_fit(oom: CudaOom, setup: Setup, lines: list[str]) -> Finding:
    """The OOM hit while the weights were being created: no budget applies yet, the model is too big."""
    held = oom.process_bytes if oom.process_bytes is not None else (oom.allocated_bytes or 0)
    needed = held + oom.tried_bytes
    total = oom.total_bytes or 0
    lines.append(
        f"the weights were still loading: vLLM's process held {gib(held)} and asked for {gib(oom.tried_bytes)} "
        f"more, so the weights alone need at least {gib(needed)}" + (f" of a {gib(total)} card" if total else "")
    )
    lines.append("gpu_memory_utilization does not apply while loading weights: lowering it cannot help")
    recommendations: list[Recommendation] = []
    current = setup.tensor_parallel_size
    if total > 0:
        size = current * 2
        while size <= MAX_TENSOR_PARALLEL and needed * current / size > TARGET_WEIGHT_SHARE * total:
            size *= 2
        size = min(size, MAX_TENSOR_PARALLEL)
        recommendations.append(
            Recommendation(
                flag="--tensor-parallel-size",
                value=size,
                why=(
                    f"at least {gib(needed * current)} of weights / {size} GPUs = {gib(needed * current / size)} "
                    f"each, at most {TARGET_WEIGHT_SHARE:.0%} of each {gib(total)} card so the KV cache has room"
                ),
            )
        )
    if setup.quantization is None:
        recommendations.append(
            Recommendation(
                flag="--quantization",
                value="fp8",
                why=(
                    f"fp8 weights take half of 16-bit ones: at least {gib(needed)} -> {gib(needed / 2)} per GPU "
                    "(needs an fp8-capable GPU: Ada, Hopper or newer; or serve an AWQ/GPTQ 4-bit checkpoint)"
                ),
            )
        )
    return Finding(
        cause=Cause.DOES_NOT_FIT,
        severity=Severity.CRITICAL,
        summary="the model's weights do not fit the GPU at this precision and parallelism",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _graph_capture(oom: CudaOom, setup: Setup, lines: list[str], log: LogFacts) -> Finding:
    """The KV cache took the budget and the graphs' own memory did not fit beside it: give them the room the
    failed allocation lacked (a lower budget), or capture fewer graphs, or none."""
    recommendations: list[Recommendation] = []
    if oom.total_bytes:
        value, source = _assumed_utilization(setup)
        shortfall = max(0, oom.tried_bytes - (oom.free_bytes or 0))
        computed = formula.utilization_for_transient(value, source, oom.tried_bytes, shortfall, oom.total_bytes)
        recommendations.append(Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why))
    fewer = _fewer_graphs(setup, log, lines)
    if fewer is not None:
        recommendations.append(fewer)
    recommendations.append(
        Recommendation(
            flag="--enforce-eager",
            value="",
            why="or no CUDA graphs at all: their memory is freed, at the cost of slower decoding",
        )
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM ran out of memory capturing CUDA graphs: the budget leaves them no room",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def default_capture_sizes(largest: int, version: tuple[int, int, int]) -> list[int]:
    """The batch sizes vLLM captures up to `largest` by default (vllm/config: `_set_cudagraph_sizes`, read in
    0.8.5, 0.10.2, 0.11.2, 0.12.0 and 0.32.0): 1, 2, 4, then every 8 (0.8-0.10: every 8 to the largest; from
    0.11: every 8 below 256, every 16 from 256)."""
    sizes = [size for size in (1, 2, 4) if size <= largest]
    if version >= (0, 11, 0):
        sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    else:
        sizes += list(range(8, largest + 1, 8))
    return sizes


def _current_capture(setup: Setup, log: LogFacts) -> tuple[list[int], str] | None:
    """The sizes this vLLM captured and where that comes from: the engine's config line, else vLLM's default for
    the version from max_num_seqs (0.10.2+: min(2 x max_num_seqs, 512); V1 0.8.x: 512), capped by
    max_num_batched_tokens."""
    version = setup.version
    if log.capture_sizes:
        return list(log.capture_sizes), "the engine's config line (cudagraph_capture_sizes)"
    if version is None:
        return None
    if log.max_capture_size is not None:
        largest, source = log.max_capture_size, f"max capture size {log.max_capture_size} (the engine's config line)"
    elif version >= (0, 10, 2) and setup.max_num_seqs is not None:
        seqs = setup.max_num_seqs
        largest = min(2 * seqs.value, GRAPH_SIZE_CAP)
        source = f"vLLM's default: min(2 x max_num_seqs {seqs.value} ({seqs.source}), {GRAPH_SIZE_CAP}) = {largest}"
    elif (0, 8, 0) <= version < (0, 9, 0):
        largest, source = GRAPH_SIZE_CAP, f"vLLM {version[0]}.{version[1]}'s default largest size {GRAPH_SIZE_CAP}"
    else:
        return None
    batched = setup.max_num_batched_tokens
    if batched is not None and batched.value < largest:
        largest = batched.value
        source += f", capped by max_num_batched_tokens {batched.value}"
    return default_capture_sizes(largest, version), source


def _fewer_graphs(setup: Setup, log: LogFacts, lines: list[str]) -> Recommendation | None:
    """Half the largest captured batch size, in the spelling this version takes (versions.graph_sizes_flag)."""
    flag = graph_sizes_flag(setup.version)
    current = _current_capture(setup, log)
    if flag is None or current is None or setup.version is None:
        lines.append(
            "fewer captured graph sizes cannot be sized from this log (no version, capture sizes or max_num_seqs): "
            "see --max-cudagraph-capture-size (0.11.2+), --cuda-graph-sizes (0.9-0.12) or --compilation-config"
        )
        return None
    sizes, source = current
    largest = sizes[-1]
    half = largest // 2 // MIN_CAPTURE_SIZE * MIN_CAPTURE_SIZE
    if half < MIN_CAPTURE_SIZE:
        return None
    kept = [size for size in sizes if size <= half] if log.capture_sizes else default_capture_sizes(half, setup.version)
    value: int | str = half
    if flag == "--compilation-config":
        value = json.dumps({"cudagraph_capture_sizes": kept}, separators=(",", ":"))
    return Recommendation(
        flag=flag,
        value=value,
        why=(
            f"or capture fewer graphs: {len(sizes)} batch sizes up to {largest} ({source}); the largest halved to "
            f"{half} keeps {len(kept)} of them, {len(kept) / len(sizes):.0%} of the graphs and the smaller ones "
            f"(their memory falls with their count and size); batches above {half} run without a graph"
        ),
    )


def _profiling(oom: CudaOom, setup: Setup, lines: list[str]) -> Finding:
    recommendations: list[Recommendation] = []
    current = setup.max_num_batched_tokens
    if current is not None:
        halved = max(MIN_BATCHED_TOKENS, current.value // 2 // MIN_BATCHED_TOKENS * MIN_BATCHED_TOKENS)
        if halved < current.value:
            recommendations.append(
                Recommendation(
                    flag="--max-num-batched-tokens",
                    value=halved,
                    why=f"the profile run's dummy batch is max_num_batched_tokens long: {current.value} "
                    f"({current.source}) halved, rounded down to a multiple of {MIN_BATCHED_TOKENS} -> {halved}",
                )
            )
    others = sum(size for _, size in oom.other_processes)
    utilization = setup.gpu_memory_utilization
    if others and utilization is not None and oom.total_bytes:
        computed = formula.utilization(oom.total_bytes, others, 0)
        if computed.value < utilization.value:
            recommendations.append(
                Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)
            )
    if not recommendations:
        lines.append("max_num_batched_tokens unknown (no arguments in the log): cannot size the profile batch")
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM ran out of memory in its profile run, before the KV cache was sized",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _oom_line(oom: CudaOom) -> str:
    parts = [f"CUDA out of memory while {_phase_text(oom.phase)}: tried to allocate {gib(oom.tried_bytes)}"]
    if oom.total_bytes is not None and oom.free_bytes is not None:
        parts.append(
            f"GPU {oom.gpu if oom.gpu is not None else '?'} had {gib(oom.free_bytes)} free of {gib(oom.total_bytes)}"
        )
    if oom.process_bytes is not None:
        parts.append(f"vLLM's process held {gib(oom.process_bytes)}")
    if oom.reserved_unallocated_bytes is not None:
        parts.append(f"{gib(oom.reserved_unallocated_bytes)} reserved by PyTorch but unallocated")
    return "; ".join(parts)


def _phase_text(phase: OomPhase) -> str:
    return {
        OomPhase.PROFILING: "profiling memory at start",
        OomPhase.GRAPH_CAPTURE: "capturing CUDA graphs at start",
        OomPhase.WEIGHT_LOADING: "loading the model's weights",
        OomPhase.SERVING: "serving",
        OomPhase.UNKNOWN: "running",
    }[phase]
