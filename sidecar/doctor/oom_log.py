"""The accelerator's out-of-memory errors in a vLLM log, whatever printed them, and the phase they hit in. Pure.

One family: PyTorch's `torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError` for CUDA, HIP (ROCm), XPU and the
other backends, with its numbers (torch 2.1+ and the older `(GPU 0; ... total capacity; ...)` form) or without;
the driver's bare `CUDA error: out of memory` / `hipErrorOutOfMemory` / `CUDA_ERROR_OUT_OF_MEMORY` (raised from
`capture_end()` during graph capture, with no numbers); the caching allocator's NVML assert where NVML may not
answer (MIG, Jetson), which replaces the OOM message; cuBLAS and NCCL failing to allocate; XLA's
`RESOURCE_EXHAUSTED` on a TPU's HBM. vLLM repeats the error in
the API server's traceback, and wraps it in its own (`EngineDeadError`, `Worker failed with error`): the last
error is the fatal one, its numbers come from the last error of the family that states them, its phase from
the traceback of the error that names one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sidecar.doctor.log_records import EXCEPTION_LINE, Record, loose
from sidecar.doctor.logfacts import CudaOom, OomPhase
from sidecar.doctor.oom_numbers import SIZE, message_numbers
from sidecar.doctor.phase import oom_phase, traceback_start

# Any member of the family, for finding the records; oom_numbers reads their numbers.
_FAMILY = loose(
    # (not Ray's OutOfMemoryError: its memory monitor killing a task for the host's memory, host_memory.py)
    r"\b(?:CUDA|HIP|XPU|NPU|MUSA|GPU) out of memory|(?<!ray\.exceptions\.)OutOfMemoryError(?!: Task was killed)"
    r"|\b(?i:(?:cuda|hip)(?: driver)? error): out of memory"
    # (not PyTorch's hint after the error: "Search for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/...")
    r"|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY|(?<!Search\x20for\x20`)cudaErrorMemoryAllocation"
    r"|Triton Error \[(?:CUDA|HIP)\]: out of memory|not enough (?:GPU|device) memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED"
    # Tenstorrent's allocator (tt-metal): "Out of Memory: Not enough space to allocate N B DRAM buffer across K banks".
    r"|Out of Memory: Not enough space to allocate \d+ B"
    # Intel Gaudi's device-memory module: "MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB", or
    # "MODULE:PT_DEVMEM OOM: No enough memory for defragment."
    r"|MODULE:PT_DEVMEM (?:Allocation failed|OOM)"
    # vLLM's linear layers' own words for an OOM in create_weights (it re-raises without PyTorch's message).
    r"|insufficient memory to allocate the weight"
    # AWS Neuron's runtime: "nrt_tensor_allocate status=4 message="Allocation Failure"", and its driver's
    # "Failed to allocate 512.000MB (usage: tensors) on ND 0:NC 0".
    r"|nrt_tensor_allocate status=\d+ message=.Allocation Failure|Failed to allocate [\d.]+ ?MB \(usage: \w+\) on ND \d"
    r"|Cuda failure \d* ?'?out of memory'?|Ran out of memory in memory space (?:hbm|vmem|smem)"
    # XLA's refusals on a TPU: "RESOURCE_EXHAUSTED: ... memory", or PJRT's "Error allocating device buffer".
    r"|RESOURCE_EXHAUSTED: (?:.{0,200}memory|Error allocating device buffer)|Runtime(?:Buffer|Program)AllocationFailure"
    r"|Error allocating device buffer: Attempting to allocate"
    r"|Attempting to reserve [\d.]+[KMGT]? at the bottom of memory"  # a compiled program's space
    # XLA's sizes on a line of their own, after "RuntimeProgramAllocationFailure: Error loading program ...:"
    r"|Attempting to allocate [\d.]+[KMGT]?\. That was not possible"
    # Ascend's CANN runtime: "Memory_Allocation_Failure(EL0004): Failed to allocate memory requested by GE module",
    # "EL0004: ... Failed to allocate memory.", "alloc device memory failed, runtime result = 207001".
    r"|Memory_Allocation_Failure\(EL0004\)|EL0004: .{0,80}Failed to allocate memory"
    r"|alloc device memory failed, runtime result = 207001"
    # torch_npu's words when an ACL call fails to get device resources (aclrtMalloc, or a graph capture's
    # AclmdlRICaptureBegin with error 207005): "[Error]: Failed to apply for memory." and no size.
    r"|\[Error\]: Failed to apply for memory"
    # PyTorch's message from its third sentence on, where a paste (a panel showing a log's tail) starts there
    r"|Of the allocated memory [\d.]+ ?\w+ is allocated by PyTorch"
    r"|(?:memory mapping|memory allocation) failed with OOM|Tried to allocate "
    + SIZE
    # Intel's GPUs (XPU) through Level Zero and its unified runtime: "level_zero backend failed with error: 40
    # (UR_RESULT_ERROR_OUT_OF_RESOURCES)", or SYCL's older "Native API returns: -5 (PI_ERROR_OUT_OF_RESOURCES)".
    # Out of resources is how the runtime reports device memory exhausted in practice (a model that starts on more
    # cards, or with less context); it names no size.
    + r"|UR_RESULT_ERROR_OUT_OF_(?:DEVICE_MEMORY|RESOURCES)|ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY"
    + r"|PI_ERROR_OUT_OF_RESOURCES"
    # Apple's Metal (vllm-metal): a command buffer the GPU could not give memory to.
    + r"|kIOGPUCommandBufferCallbackErrorOutOfMemory|\[METAL\][^\n]{0,200}Insufficient Memory"
    # PyTorch's caching allocator on its out-of-memory path asks NVML for the card's memory to word the error;
    # where NVML may not answer (a MIG slice in a container, Jetson) that call's assert is all that is printed
    # (pytorch/pytorch#112377, #185240): an OOM with no numbers.
    + r'|NVML_SUCCESS == r INTERNAL ASSERT FAILED at "[^"]*CUDACachingAllocator\.cpp"'
)
# The sentences of PyTorch's out-of-memory message after its first, as they start.
_SENTENCE = re.compile(
    r"\s*(?:GPU \d+ has a total capac|Of the allocated memory|Process \d+ has|Including non-PyTorch memory"
    r"|this process has|Process has|[\d.]+ ?\w+ is reserved by PyTorch|If reserved but unallocated"
    r"|See documentation for Memory"
    r"|PyTorch but unallocated)"  # a wrap inside "is reserved by / PyTorch but unallocated"
)
_MAX_SENTENCES = 6
_MAX_PLACED = 20  # the last errors of the family a phase is looked for in
_NEURON = re.compile(r"nrt_tensor_allocate|on ND \d+:NC \d+")
_LEVEL_ZERO = re.compile(r"level_zero|UR_RESULT_ERROR|ZE_RESULT_ERROR|PI_ERROR")
_CANN = re.compile(r"EL0004|runtime result = 207001|Failed to apply for memory")
_DEVICE_NAME = re.compile(
    r"\b(HIP|XPU|NPU|HPU|MUSA|TPU|METAL)\b|\bhip|\bhbm\b|\bTpuClient\b|\btpu_pjrt|memory space [vs]mem\b"
    r"|tpu_custom_call|Runtime(?:Buffer|Program)AllocationFailure|jax\.errors|_HBM\d|(PT_DEVMEM)"
)
# Where the error line itself says it was: vLLM's linear layers and model loader name the weights, and sleep
# mode's allocator names its own source file when it cannot map memory back.
_PHASE_ON_THE_LINE: tuple[tuple[OomPhase, re.Pattern[str]], ...] = (
    (
        OomPhase.WEIGHT_LOADING,
        re.compile(r"Failed to create \w+ (?:\w+ )?weights|while loading weights|Failed to load model"),
    ),
    (OomPhase.WAKE_UP, re.compile(r"cumem_allocator")),
    # vLLM's hint on an OOM in its CUDA-graph memory profiling or capture names the switch of that estimate; a
    # runtime's error names the call that failed (torch_npu: "capture_begin:...compiler_depend.ts:214 NPU function
    # error: c10_npu::acl::AclmdlRICaptureBegin(...), error code is 207005").
    (
        OomPhase.GRAPH_CAPTURE,
        re.compile(r"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS|\bcapture_(?:begin|end)\b|\w*Capture(?:Begin|End)\b"),
    ),
)
# vLLM V1's multiprocess executor: the error of a worker's failed RPC (determine_available_memory,
# initialize_from_config, compile_or_warm_up_model, execute_model) as the executor wraps it, and the worker's own
# line above the traceback (vllm/v1/executor/multiproc_executor.py 0.9-0.33). init_device and load_model run in
# the worker's constructor, whose failure is logged as "WorkerProc failed to start." instead.
_WORKER_RPC = re.compile(r"Worker failed with error '")
_WORKER_RPC_HEADER = re.compile(r"WorkerProc hit an exception")
_ERROR_BLOCK = 3  # records from an exception's line to the runtime's memory sentence after it (torch_npu's block)


def find_oom(records: Sequence[Record]) -> CudaOom | None:
    """The last out-of-memory error of the log, with the numbers and the phase its family states."""
    family = [index for index, record in enumerate(records) if _FAMILY.search(record.payload)]
    if not family:
        return None
    last = family[-1]
    numbers = message_numbers([_message(records, index) for index in reversed(family)])
    phase, where = OomPhase.UNKNOWN, "no traceback frame or progress line places it"
    for index in reversed(family[-_MAX_PLACED:]):  # a serving loop can repeat the error thousands of times
        phase, where = _phase(records, index)
        if phase is not OomPhase.UNKNOWN:
            break
    record = records[last]
    message = record.payload.strip()
    after_load = phase is OomPhase.UNKNOWN and _in_a_workers_rpc(records, family)
    if after_load:
        where = (
            "no frame places it, but a worker returned it to an RPC ('Worker failed with error'): after the weights "
            "loaded, which vLLM's workers do as they start, not by an RPC"
        )
    return CudaOom(
        phase=phase,
        phase_evidence=where,
        after_load=after_load,
        device=_device(records, family),
        message=message,
        rank=next((records[i].rank for i in reversed(family) if records[i].rank is not None), None),
        **numbers,  # type: ignore[arg-type]
    )


def _in_a_workers_rpc(records: Sequence[Record], family: list[int]) -> bool:
    """Whether a V1 worker raised the error in an RPC, after its weights loaded: the executor's wrapper around it,
    or the worker's line just above the last error's traceback."""
    if any(_WORKER_RPC.search(records[index].payload) for index in family):
        return True
    header = traceback_start(records, family[-1]) - 1
    return header >= 0 and _WORKER_RPC_HEADER.search(records[header].payload) is not None


def _message(records: Sequence[Record], index: int) -> str:
    """The error's record with the sentences of PyTorch's message that a paste put on records of their own (each
    starts with a capital, so nothing joined them): its numbers read as one message."""
    parts = [records[index].payload]
    for record in records[index + 1 : index + 1 + _MAX_SENTENCES]:
        if not _SENTENCE.match(record.payload):
            break
        parts.append(record.payload.strip())
    return " ".join(parts)


def _phase(records: Sequence[Record], index: int) -> tuple[OomPhase, str]:
    payload = records[index].payload
    for before in range(index - 1, max(-1, index - 1 - _ERROR_BLOCK), -1):
        if _FAMILY.search(records[before].payload):
            break
        if EXCEPTION_LINE.match(records[before].payload):
            # The error's later sentence ("This may be caused by insufficient memory ...", torch_npu's "[Error]:
            # Failed to apply for memory."): its first, the exception a record or two before, says where it was.
            payload = f"{records[before].payload} {payload}"
            break
    for phase, pattern in _PHASE_ON_THE_LINE:
        said = pattern.search(payload)
        if said is not None:
            return phase, f"the error line says so: {said.group(0)!r}"
    return oom_phase(records, index)


def _device(records: Sequence[Record], family: list[int]) -> str:
    if any(_NEURON.search(records[index].payload) for index in family):
        return "NEURON"
    if any(_CANN.search(records[index].payload) for index in family):
        return "NPU"
    if any(_LEVEL_ZERO.search(records[index].payload) for index in family):
        return "XPU"
    for index in reversed(family):
        match = _DEVICE_NAME.search(records[index].payload)
        if match is not None:
            named = match.group(1) or ("HPU" if match.group(2) else "HIP" if match.group(0).lower() == "hip" else "TPU")
            return named.upper()
    return "CUDA"
