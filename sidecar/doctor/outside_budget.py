"""Out-of-memory errors in memory the budget does not share out, so its lowering is no fix. Pure.

A process capped below the card (PyTorch's per-process memory fraction); a TPU kernel's on-chip scratch (vector
memory: the kernel's own need while compiling) or its scalar memory (the block tables: fewer sequences or shorter
ones); AWS Neuron's KV cache, allocated at load for a fixed batch of max_num_seqs x max_model_len; sleep mode that
could not map its memory back on wake-up. `oom_readings.not_the_budget` asks these first.
"""

from __future__ import annotations

import re

from sidecar.doctor import formula, remedies
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import CudaOom, LogFacts, OomPhase
from sidecar.doctor.phase import RAN_OUT, phase_text
from sidecar.doctor.remedies import sequences
from sidecar.doctor.setup import Setup

# XLA's on-chip memory spaces (a TensorCore's vector and scalar scratch), as its RESOURCE_EXHAUSTED names them:
# a kernel's own need while compiling, which no budget of the device's memory (HBM) changes.
_ON_CHIP = re.compile(r"memory space (vmem|smem)\b", re.IGNORECASE)


def outside_the_budget(
    oom: CudaOom, phase: OomPhase, *, ledger: MemoryLedger, setup: Setup, log: LogFacts, lines: list[str]
) -> Finding | None:
    """Memory the budget does not share out: a TPU kernel's on-chip scratch, sleep mode's mapping back, a cap
    on the process below the card."""
    if _capped(oom):
        return _capped_by_fraction(oom, phase, ledger, lines)
    if (on_chip := _ON_CHIP.search(oom.message)) is not None:
        space = on_chip.group(1).upper()
        return _block_tables(setup, log, lines) if space == "SMEM" else _on_chip_scratch(space, lines)
    if oom.device == "NEURON" and phase is OomPhase.KV_ALLOCATION:
        return _static_kv_cache(setup, log, lines)
    return _wake_up(lines) if phase is OomPhase.WAKE_UP else None


def _fewer_sequences_or_shorter(
    setup: Setup, log: LogFacts, sequences_why: str, length_why: str
) -> list[Recommendation]:
    """Half of max_num_seqs and of max_model_len, where the log or vLLM's default states them: for memory their
    product sizes."""
    halved = (sequences(setup, log, sequences_why), remedies.shorter_max_model_len(setup, length_why))
    return [r for r in halved if r is not None]


def _static_kv_cache(setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    """AWS Neuron (transformers-neuronx, NxD Inference) allocates its KV cache at load for a fixed batch:
    max_num_seqs sequences of max_model_len positions, whatever gpu_memory_utilization says."""
    recommendations = _fewer_sequences_or_shorter(
        setup,
        log,
        "Neuron's KV cache is allocated at load for max_num_seqs sequences",
        "of max_model_len positions each",
    )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.CRITICAL,
        summary=(
            "the NeuronCore could not hold the KV cache Neuron allocates at load: max_num_seqs x max_model_len "
            "sizes it, not a budget"
        ),
        evidence=(
            *lines,
            "on Neuron the KV cache is a static allocation for max_num_seqs sequences of max_model_len positions: "
            "gpu_memory_utilization does not change it",
        ),
        recommendations=tuple(recommendations),
        steps=(
            (
                "or spread the cache over more NeuronCores (--tensor-parallel-size: an inf2.8xlarge has 2, each with "
                "its own memory)",
            )
            if recommendations
            else (
                "the log states neither max_num_seqs nor max_model_len: halve either (their product sizes the "
                "cache), or spread it over more NeuronCores (--tensor-parallel-size)",
            )
        ),
    )


def _block_tables(setup: Setup, log: LogFacts, lines: list[str]) -> Finding:
    """SMEM holds what the attention kernel prefetches as scalars: the block tables of every sequence a step may
    run (max_num_seqs x max_model_len / block_size entries), so fewer sequences or a shorter length shrink it."""
    recommendations = _fewer_sequences_or_shorter(
        setup,
        log,
        "SMEM holds a block table per sequence the kernel was compiled for",
        "and each table has max_model_len / block_size entries",
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=(
            "a TPU attention kernel's scalar arguments (the block tables) outgrew the core's on-chip SMEM while "
            "compiling: max_num_seqs x max_model_len sizes them, not the HBM budget"
        ),
        evidence=(
            *lines,
            "SMEM is a TensorCore's scalar scratch, not HBM: gpu_memory_utilization does not change it; the "
            "kernel prefetches max_num_seqs x (max_model_len / block_size) block-table entries into it",
        ),
        recommendations=tuple(recommendations),
        steps=()
        if recommendations
        else ("the log states neither max_num_seqs nor max_model_len: halve either (their product sizes SMEM's use)",),
    )


def _on_chip_scratch(space: str, lines: list[str]) -> Finding:
    return Finding(
        cause=Cause.OTHER,
        severity=Severity.CRITICAL,
        summary=(
            f"a TPU kernel needed more of the core's on-chip {space} than it has, while compiling: not the device "
            "memory vLLM's budget governs"
        ),
        evidence=(*lines, f"{space} is a TensorCore's own scratch memory, not HBM: no budget or length changes it"),
        steps=(
            "no memory flag applies; the kernel's tiling for the shape it compiled does: try a smaller compiled "
            "batch (--max-num-batched-tokens) and report the program's requirement to the TPU backend",
        ),
    )


def _capped(oom: CudaOom) -> bool:
    """PyTorch refused the allocation at the process's memory fraction while the card had room for it."""
    allowed, tried, free = oom.allowed_bytes, oom.tried_bytes, oom.free_bytes
    return allowed is not None and tried is not None and free is not None and free >= tried


def _capped_by_fraction(oom: CudaOom, phase: OomPhase, ledger: MemoryLedger, lines: list[str]) -> Finding:
    """`torch.cuda.set_per_process_memory_fraction`, which vLLM does not call but a framework that runs it can
    (colocated training, a notebook), caps the caching allocator below the card: vLLM's budget, a share of the
    whole card, must fit under that cap."""
    allowed, total = oom.allowed_bytes or 0, oom.total_bytes or 0
    lines.append(
        f"PyTorch allowed this process {gib(allowed)} (a per-process memory fraction of "
        f"{allowed / total if total else 0:.2f}): {gib(oom.free_bytes or 0)} was free on the card for the "
        f"{gib(oom.tried_bytes or 0)} allocation, the cap refused it"
    )
    recommendations: list[Recommendation] = []
    if total:
        ceiling = formula.floor_hundredths(allowed / total - formula.GRAPH_MARGIN_RATIO)
        if ceiling < ledger.utilization and ceiling >= remedies.MIN_USEFUL_UTILIZATION:
            recommendations.append(
                Recommendation(
                    flag="--gpu-memory-utilization",
                    value=ceiling,
                    why=(
                        f"{gib(allowed)} allowed / {gib(total)} - {formula.GRAPH_MARGIN_RATIO:.0%} margin = "
                        f"{allowed / total - formula.GRAPH_MARGIN_RATIO:.4f}, rounded down -> {ceiling:.2f}: at most "
                        f"this, so vLLM's budget fits under the cap (today {ledger.utilization:g}, "
                        f"{ledger.utilization_source})"
                    ),
                )
            )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=(
            f"{RAN_OUT} while {phase_text(phase)}: a per-process memory fraction capped PyTorch at "
            f"{gib(allowed)}, below what vLLM's budget asks of the card"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=(
            "or raise the fraction where it is set (torch.cuda.set_per_process_memory_fraction, by the program that "
            "runs vLLM): vLLM sizes its budget from the whole card, not from the cap",
        ),
    )


def _wake_up(lines: list[str]) -> Finding:
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary="vLLM could not map its memory back waking from sleep mode: something else took it meanwhile",
        evidence=tuple(lines),
        steps=(
            "vLLM maps back the weights and the KV cache its --gpu-memory-utilization sized at start; a process "
            "sharing the card (an RL trainer) still holds what they need",
            "free the other process's memory before wake_up (torch.cuda.empty_cache, offload its optimizer), or "
            "lower vLLM's --gpu-memory-utilization by what the other process keeps: the log states neither amount",
        ),
    )
