"""What one sample of the allocator probe costs inside a vLLM process: the plugin's whole sample (role, rank,
allocator statistics of each device in use, free memory) and its atomic file write, against one
``torch.cuda.memory_stats()`` call measured in the same run (the irreducible part: the allocator's own report).

Runs in whatever interpreter runs the bench: with torch and a GPU it measures the CUDA path (as in a vLLM
worker); without, the path of a process with no CUDA (the API server) and no reference.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_sidecar_probe.sample import CudaReader, take_sample
from vllm_sidecar_probe.writer import Sampler


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeCost:
    path: str  # what the sample read: "cuda (<device name>)" or why not
    sample_us: float
    write_us: float  # the sample plus its atomic write
    memory_stats_us: float | None  # the reference; None without CUDA


def _median_us(run: Callable[[], object], rounds: int, repeats: int) -> float:
    medians = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(rounds):
            run()
        medians.append((time.perf_counter() - started) / rounds * 1e6)
    return statistics.median(medians)


def _cuda_torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - optional: only where the bench runs beside a GPU
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.empty(1, device="cuda")  # initialised, as in a vLLM worker
    return torch


def measure_probe_cost(*, repeats: int, rounds: int = 500) -> ProbeCost:
    torch = _cuda_torch()
    held = [] if torch is None else [torch.empty((n + 1) << 20, dtype=torch.uint8, device="cuda") for n in range(64)]
    reader = CudaReader()
    first = take_sample(reader, interval_s=2.0)
    path = f"cuda ({torch.cuda.get_device_name()})" if torch is not None else str(first["cuda"]["reason"])
    sample_us = _median_us(lambda: take_sample(reader, interval_s=2.0), rounds, repeats)
    with tempfile.TemporaryDirectory() as folder:
        sampler = Sampler(Path(folder), 2.0)
        write_us = _median_us(sampler.write_once, rounds, repeats)
    reference = None if torch is None else _median_us(torch.cuda.memory_stats, rounds, repeats)
    del held
    return ProbeCost(path=path, sample_us=sample_us, write_us=write_us, memory_stats_us=reference)


if __name__ == "__main__":
    cost = measure_probe_cost(repeats=int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    print(cost)
