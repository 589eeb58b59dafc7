"""One sample of this process: who it is in vLLM (role, rank) and its CUDA allocator's statistics.

No I/O beyond reading this process's own title. Reads torch only when vLLM already imported it, and CUDA only
when this process already initialised it: asking a process that never used the GPU would create a CUDA
context (hundreds of MiB of GPU memory) in it. Nothing here synchronises a device: ``memory_stats`` reads the
allocator's counters under its lock and ``mem_get_info`` asks the driver, neither waits for kernels.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

# vLLM titles its processes "<prefix>::<name>" (setproctitle): VLLM::EngineCore, VLLM::EngineCore_DP1,
# VLLM::Worker_TP0, VLLM::APIServer_0, VLLM::DPCoordinator. The prefix is VLLM_PROCESS_NAME_PREFIX.
_TITLE = re.compile(r"::(?P<name>[A-Za-z]+)")
_ROLES = {"EngineCore": "engine", "Worker": "worker", "APIServer": "api"}
# The allocator's counters the sidecar exports, by the field name in the file.
_STAT_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def process_title() -> str:
    """The title setproctitle gave this process, else its command line."""
    module = sys.modules.get("setproctitle")
    if module is not None:
        with contextlib.suppress(Exception):  # fall back to the command line
            return str(module.getproctitle())
    try:
        return Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return " ".join(sys.argv)


def role_of(title: str, *, is_main_process: bool) -> str:
    """api, engine, worker or other. Before vLLM titles its first process, that one is the API server."""
    match = _TITLE.search(title)
    if match is not None:
        return _ROLES.get(match.group("name"), "other")
    return "api" if is_main_process and "serve" in title else "other"


def rank_of(torch: Any) -> int | None:
    """The global rank in torch.distributed, once vLLM initialised it (workers, and an engine core that holds
    its only worker); None elsewhere."""
    if torch is None or "torch.distributed" not in sys.modules:
        return None
    try:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return int(distributed.get_rank())
    except Exception:  # noqa: BLE001 - a rank is a label, never worth an error
        return None
    return None


def physical_index(local_index: int, visible: str | None) -> int:
    """The NVML index of torch's device ``local_index``: CUDA_VISIBLE_DEVICES renumbers devices from 0. A list
    of UUIDs or MIG names cannot be mapped here; the file then carries torch's own index and the UUID."""
    if not visible:
        return local_index
    entries = [entry.strip() for entry in visible.split(",")]
    if local_index < len(entries) and entries[local_index].isdigit():
        return int(entries[local_index])
    return local_index


class CudaReader:
    """Reads the allocator statistics of the devices this process uses. Keeps each device's UUID (it never
    changes) so a sample asks the driver only for free memory."""

    def __init__(self) -> None:
        self._uuids: dict[int, str | None] = {}

    def read(self, torch: Any) -> dict[str, Any]:
        if torch is None:
            return {"available": False, "reason": "torch is not imported in this process", "devices": []}
        cuda = torch.cuda
        if not cuda.is_initialized():
            reason = "CUDA is not initialised in this process"
            if not torch.backends.cuda.is_built():
                reason = "this torch has no CUDA (a CPU build)"
            return {"available": False, "reason": reason, "devices": []}
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        current = cuda.current_device()
        devices = []
        for local in range(cuda.device_count()):
            stats = cuda.memory_stats(local)
            if local != current and not stats.get("reserved_bytes.all.peak"):
                continue  # never used here: mem_get_info would create a context on it
            free_bytes, total_bytes = cuda.mem_get_info(local)
            device: dict[str, int | str | None] = {field: int(stats.get(key, 0)) for field, key in _STAT_KEYS.items()}
            device.update(
                index=physical_index(local, visible),
                uuid=self._uuid(cuda, local),
                free_bytes=int(free_bytes),
                total_bytes=int(total_bytes),
            )
            devices.append(device)
        return {"available": True, "reason": None, "devices": devices}

    def _uuid(self, cuda: Any, local: int) -> str | None:
        if local not in self._uuids:
            try:
                self._uuids[local] = "GPU-" + str(cuda.get_device_properties(local).uuid)
            except Exception:  # noqa: BLE001 - older torch has no uuid; the index still names the device
                self._uuids[local] = None
        return self._uuids[local]


def take_sample(reader: CudaReader, *, interval_s: float) -> dict[str, Any]:
    """The document of this process now (see the contract's allocator probe)."""
    torch = sys.modules.get("torch")
    try:
        cuda = reader.read(torch)
    except Exception as error:  # noqa: BLE001 - a failing read is reported in the file, not raised into vLLM
        cuda = {"available": False, "reason": f"{type(error).__name__}: {error}"[:300], "devices": []}
    return {
        "pid": os.getpid(),
        "role": role_of(process_title(), is_main_process=multiprocessing.parent_process() is None),
        "rank": rank_of(torch),
        "time_unix_s": time.time(),
        "interval_s": interval_s,
        "cuda": cuda,
    }
