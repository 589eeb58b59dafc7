"""What a GPU source reports for one tick: devices, their memory and processes. Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ProcessOwner(StrEnum):
    """Whose process holds GPU memory, so memory outside vLLM can be told apart."""

    VLLM = "vllm"
    OTHER = "other"
    UNKNOWN = "unknown"  # the PID is not visible from here (another PID namespace) or has no name


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # NVML reports "not available" under some drivers and in MIG
    name: str | None
    owner: ProcessOwner


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuDevice:
    index: int
    uuid: str | None
    name: str | None
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    utilization_ratio: float | None
    temperature_celsius: float | None
    processes: tuple[GpuProcess, ...]
    xid_errors_total: int | None  # cumulative since the source started; None when the driver offers no Xid events
    last_xid: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuReading:
    """A successful read of the watched GPUs (possibly none: no GPU is a normal state)."""

    devices: tuple[GpuDevice, ...]
    driver_version: str | None
    problems: tuple[str, ...] = ()
