"""What the allocator probe (the vLLM plugin in ``vllm_sidecar_probe``) reports: per vLLM process, PyTorch's CUDA
caching-allocator statistics for each device it uses. Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ProcessRole(StrEnum):
    API = "api"
    ENGINE = "engine"
    WORKER = "worker"
    OTHER = "other"


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorDevice:
    index: int  # the GPU's NVML index where the plugin could map it (CUDA_VISIBLE_DEVICES of integers)
    uuid: str | None
    allocated_bytes: int  # held by live tensors
    reserved_bytes: int  # held by the caching allocator from the driver
    active_bytes: int
    inactive_split_bytes: int  # free pieces of split blocks: reserved but too small for a large request
    peak_reserved_bytes: int
    alloc_retries: int  # cudaMalloc failed, the cache was flushed and the allocation retried (since start)
    ooms: int  # allocations that failed even after the retry (since start)
    free_bytes: int  # the driver's free memory on the device, all processes
    total_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeProcess:
    pid: int
    role: ProcessRole
    rank: int | None  # torch.distributed's global rank; None outside workers
    time_unix_s: float  # when the plugin took the sample (wall clock, same host)
    interval_s: float  # the plugin's sampling interval: a sample older than three of them is stale
    cuda_available: bool
    reason: str | None  # why not, when cuda_available is false
    devices: tuple[AllocatorDevice, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorReading:
    """The fresh samples of one read of the probe directory, and one line per file that could not be used."""

    processes: tuple[ProbeProcess, ...]
    problems: tuple[str, ...] = ()
