"""The NVML source against a real NVIDIA driver, with this process holding GPU memory through PyTorch.
Needs an NVIDIA GPU (skipped without one; see conftest)."""

from __future__ import annotations

import asyncio
import os
from types import ModuleType
from typing import Any

from sidecar.derive.gpu import derive_gpu
from sidecar.derive.settings import DeriveSettings
from sidecar.model.gpu import ProcessOwner
from sidecar.sources.nvml import NvmlSource

GIB = 1 << 30


def _memory_v2(index: int) -> dict[str, int] | str:
    """NVML's v2 memory info (total, reserved, used, free), for the record: what the v1 call the source uses
    folds into "used"."""
    import pynvml

    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index), version=pynvml.nvmlMemory_v2)
        return {name: int(getattr(info, name)) for name in ("total", "reserved", "used", "free")}
    except pynvml.NVMLError as error:
        return str(error)
    finally:
        pynvml.nvmlShutdown()


def test_nvml_reads_the_card_and_this_process(torch_cuda: ModuleType, record: dict[str, Any]) -> None:
    torch = torch_cuda
    held = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    free_torch, total_torch = torch.cuda.mem_get_info()
    source = NvmlSource(vllm_process_pattern=r"pytest|python", timeout_s=10.0)
    try:
        result = asyncio.run(source.read())
        again = asyncio.run(source.read())  # a second read on the same session (Xid events, process list)
    finally:
        source.close()
    assert result.ok, result.error
    assert again.ok, again.error
    reading = result.value
    assert reading is not None
    record.update(driver=reading.driver_version, problems=reading.problems, duration_s=result.duration_s)
    record["devices"] = [repr(device) for device in reading.devices]
    assert reading.driver_version
    assert reading.devices
    uuid = "GPU-" + str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    (device,) = [device for device in reading.devices if device.uuid == uuid]
    assert device.name
    # The source reads NVML's v2 memory info and leaves out what the driver reserves, as CUDA's total (and so
    # vLLM's budget) does; the free memory is the same figure in both (within what moved between the calls).
    record.update(nvml_total=device.memory_total_bytes, cuda_total=total_torch)
    record.update(nvml_free=device.memory_free_bytes, cuda_free=free_torch)
    record["nvml_v2"] = _memory_v2(device.index)
    assert device.memory_total_bytes == total_torch
    assert abs(device.memory_free_bytes - free_torch) < GIB
    assert device.memory_used_bytes >= held.numel()
    mine = [process for process in device.processes if process.pid == os.getpid()]
    record["this_process"] = repr(mine)
    assert mine, f"this process ({os.getpid()}) is not in NVML's list: {device.processes}"
    assert mine[0].owner is ProcessOwner.VLLM  # the pattern matched its command line
    if mine[0].used_memory_bytes is not None:
        assert mine[0].used_memory_bytes >= held.numel()
    derived = derive_gpu(device, [], 0.9, DeriveSettings())
    record["derived"] = repr(derived)
    assert derived.memory_budget_bytes == int(0.9 * device.memory_total_bytes)
    assert derived.vllm_process_memory_bytes is not None
    assert derived.vllm_process_memory_bytes >= held.numel()
