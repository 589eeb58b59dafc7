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
from collections.abc import Callable, Sequence

from sidecar.doctor.log_records import EXCEPTION_LINE, Record, loose
from sidecar.doctor.logfacts import CudaOom, OomPhase
from sidecar.doctor.phase import oom_phase

_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6}
_UNITS |= {"GB": 10**9}
_SIZE = r"([\d.]+ ?(?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB))"
_DEVICE = r"(CUDA|HIP|XPU|NPU|MPS|MUSA|GPU)"
# Any member of the family, for finding the records; the patterns below read their numbers.
_FAMILY = loose(
    # (not Ray's OutOfMemoryError: its memory monitor killing a task for the host's memory, host_memory.py)
    r"\b(?:CUDA|HIP|XPU|NPU|MUSA|GPU) out of memory|(?<!ray\.exceptions\.)OutOfMemoryError(?!: Task was killed)"
    r"|\b(?i:(?:cuda|hip)(?: driver)? error): out of memory"
    # (not PyTorch's hint after the error: "Search for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/...")
    r"|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY|(?<!Search\x20for\x20`)cudaErrorMemoryAllocation"
    r"|Triton Error \[(?:CUDA|HIP)\]: out of memory|not enough (?:GPU|device) memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED"
    # Intel Gaudi's device-memory module: "MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB", or
    # "MODULE:PT_DEVMEM OOM: No enough memory for defragment."
    r"|MODULE:PT_DEVMEM (?:Allocation failed|OOM)"
    # vLLM's linear layers' own words for an OOM in create_weights (it re-raises without PyTorch's message).
    r"|insufficient memory to allocate the weight"
    # AWS Neuron's runtime: "nrt_tensor_allocate status=4 message="Allocation Failure"", and its driver's
    # "Failed to allocate 512.000MB (usage: tensors) on ND 0:NC 0".
    r"|nrt_tensor_allocate status=\d+ message=.Allocation Failure|Failed to allocate [\d.]+ ?MB \(usage: \w+\) on ND \d"
    r"|Cuda failure \d* ?'out of memory'|Ran out of memory in memory space (?:hbm|vmem|smem)"
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
    + _SIZE
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
# PyTorch's allocator with expandable segments, when the driver cannot map more: "expandable_segments: memory
# mapping failed with OOM on device 4 while trying to map 20971520 bytes (free: 17235968, total: 25295323136)".
_MAPPING = loose(
    r"(?:mapping|memory allocation) failed with OOM on device (\d+) while trying to (?:map|allocate) (\d+) bytes "
    r"\(free: (\d+), total: (\d+)\)"
)
_MODERN = loose(
    r"(?:(?:" + _DEVICE + r" out of memory\. )?"  # a quote can start at "Tried", or after it (a trimmed paste)
    + r"Tried to allocate " + _SIZE + r"\. )?GPU (\d+)? ?has a total capac(?:i)?ty of " + _SIZE
    + r" of which " + _SIZE + r" is free\."
)  # fmt: skip
_TRIED = loose(r"Tried to allocate " + _SIZE)
# PJRT's refusal on a TPU, sizes in binary units with one letter (tsl's HumanReadableNumBytes): "Attempting to
# allocate 1002.00M. That was not possible. There are 897.41M free." It never states the chip's memory. A compiled
# program's space is reserved instead (RuntimeProgramAllocationFailure): "Attempting to reserve 1.04G at the
# bottom of memory. That was not possible. There are 176.58M free, 0B reserved, and 176.58M reservable."
_XLA_SIZE = r"([\d.]+)([KMGT]|B\b)"
_ATTEMPTING = loose(
    r"Attempting to (?:allocate|reserve) "
    + _XLA_SIZE
    + r"(?: at the bottom of memory)?\. That was not possible\. There are "
    + _XLA_SIZE
    + " free"
)
_XLA_UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_ALL_OF_IT = 0.97  # the share of the card's used memory that the listed processes hold when one of them is this one
_NO_CARD_HOLDS = 2**50  # bytes (1 PiB): a process figure above it is an overflow, not memory in use
_THIS_PROCESS = loose(r"(?:this process|\bProcess) has " + _SIZE + r" memory in use")  # "Process has": trimmed
_UNALLOCATED = loose(_SIZE + r" is reserved by PyTorch but unallocated")
_ALLOCATED = loose(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_PRIVATE_POOLS = loose(r"with " + _SIZE + r" allocated in private pools")
_ALLOWED = loose(_SIZE + r" allowed;")  # torch.cuda.set_per_process_memory_fraction's cap, when one is set
# torch < 2.1: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.12 MiB
# free; 14.66 GiB reserved in total by PyTorch)"
_LEGACY = loose(
    r"Tried to allocate "
    + _SIZE
    + r" \((?:GPU|NPU|XPU) (\d+); "
    + _SIZE
    + r" total capacity; "
    + _SIZE
    + r" already allocated(?:; (?:[\d.]+ ?\w+ current active; )?(?:"
    + _SIZE
    + r" free;? ?)?(?:"
    + _SIZE
    + r" reserved in total by PyTorch)?)?\)"
)  # fmt: skip  (XPU's allocator leaves out the free field; torch_npu adds "current active"; a paste may stop at
#    "already allocated)" or at "... free)")
_OTHER_PROCESS = loose(r"Process (\d+) has " + _SIZE + r" memory in use")
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
_ERROR_BLOCK = 3  # records from an exception's line to the runtime's memory sentence after it (torch_npu's block)


def size_bytes(text: str) -> int:
    """`1.95 GiB` as PyTorch prints sizes (binary units; GB/MB taken as decimal) to bytes."""
    match = re.fullmatch(r"([\d.]+) ?(\w+)", text.strip())
    if match is None:
        raise ValueError(text)
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def find_oom(records: Sequence[Record]) -> CudaOom | None:
    """The last out-of-memory error of the log, with the numbers and the phase its family states."""
    family = [index for index, record in enumerate(records) if _FAMILY.search(record.payload)]
    if not family:
        return None
    last = family[-1]
    payloads = [_message(records, index) for index in reversed(family)]
    numbers = next((found for payload in payloads if (found := _numbers(payload, _modern, _legacy, _mapping))), None)
    numbers = numbers or next(
        (found for payload in payloads if (found := _numbers(payload, _attempting, _tried_only))), None
    )
    phase, where = OomPhase.UNKNOWN, "no traceback frame or progress line places it"
    for index in reversed(family[-_MAX_PLACED:]):  # a serving loop can repeat the error thousands of times
        phase, where = _phase(records, index)
        if phase is not OomPhase.UNKNOWN:
            break
    record = records[last]
    message = record.payload.strip()
    return CudaOom(
        phase=phase,
        phase_evidence=where,
        device=_device(records, family),
        message=message,
        rank=next((records[i].rank for i in reversed(family) if records[i].rank is not None), None),
        **(numbers or _no_numbers()),  # type: ignore[arg-type]
    )


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


def _no_numbers() -> dict[str, object]:
    return {
        "tried_bytes": None,
        "gpu": None,
        "total_bytes": None,
        "free_bytes": None,
        "process_bytes": None,
        "allocated_bytes": None,
        "reserved_unallocated_bytes": None,
        "other_processes": (),
    }


def _numbers(line: str, *readers: Callable[[str], dict[str, object] | None]) -> dict[str, object] | None:
    for read in readers:
        try:
            found = read(line)
        except (ValueError, KeyError):  # a size PyTorch never prints ("1.2.3 GiB"): not its message
            found = None
        if found is not None:
            return found
    return None


def _modern(line: str) -> dict[str, object] | None:
    modern = _MODERN.search(line)
    if modern is None:
        return None
    rest = line[modern.end() :]
    process = _THIS_PROCESS.search(rest)
    unallocated = _UNALLOCATED.search(rest)
    allocated_match = _ALLOCATED.search(rest)
    allocated = size_bytes(allocated_match.group(1)) if allocated_match else None
    processes = [(int(pid), size_bytes(size)) for pid, size in _OTHER_PROCESS.findall(rest)]
    process_bytes = size_bytes(process.group(1)) if process else None
    if process_bytes is not None and (
        process_bytes > _NO_CARD_HOLDS or (allocated is not None and process_bytes < allocated)
    ):
        # Not a measurement: WSL printed 17179869184.00 GiB (2^64 bytes, a wrapped count); where NVML cannot see
        # the process (a container, vGPU) PyTorch prints "0 bytes" beside the GiBs it allocated itself.
        process_bytes = None
    if process_bytes is None and processes:
        # In a container PyTorch cannot tell its own PID apart and lists itself as "Process N": the one
        # process that holds at least what PyTorch allocated is vLLM's own; with that number cut off, the
        # largest (vLLM holds its whole budget).
        own = [entry for entry in processes if allocated is None or entry[1] >= allocated]
        used = size_bytes(modern.group(4)) - size_bytes(modern.group(5))
        if allocated is None or (not own and sum(size for _, size in processes) >= _ALL_OF_IT * used):
            # The listed processes hold all the card's used memory, this one's allocations included: the largest
            # is this one (sleep mode's allocator reports more allocated than the card has, so no figure matches).
            own = [max(processes, key=lambda entry: entry[1])]
        if len(own) == 1:
            process_bytes = own[0][1]
            processes.remove(own[0])
    return {
        "tried_bytes": size_bytes(modern.group(2)) if modern.group(2) else None,
        "gpu": int(modern.group(3)) if modern.group(3) else None,
        "total_bytes": size_bytes(modern.group(4)),
        "free_bytes": size_bytes(modern.group(5)),
        "process_bytes": process_bytes,
        "allocated_bytes": allocated,
        "private_pool_bytes": size_bytes(pools.group(1)) if (pools := _PRIVATE_POOLS.search(rest)) else None,
        "allowed_bytes": size_bytes(allowed.group(1)) if (allowed := _ALLOWED.search(rest)) else None,
        "reserved_unallocated_bytes": size_bytes(unallocated.group(1)) if unallocated else None,
        "other_processes": tuple(processes),
    }


def _legacy(line: str) -> dict[str, object] | None:
    legacy = _LEGACY.search(line)
    if legacy is None:
        return None
    reserved = size_bytes(legacy.group(6)) if legacy.group(6) else None
    allocated = size_bytes(legacy.group(4))
    return {
        "tried_bytes": size_bytes(legacy.group(1)),
        "gpu": int(legacy.group(2)),
        "total_bytes": size_bytes(legacy.group(3)),
        "free_bytes": size_bytes(legacy.group(5)) if legacy.group(5) else None,
        "process_bytes": reserved,
        "allocated_bytes": allocated,
        "reserved_unallocated_bytes": max(0, reserved - allocated) if reserved is not None else None,
        "other_processes": (),
    }


def _mapping(line: str) -> dict[str, object] | None:
    mapping = _MAPPING.search(line)
    if mapping is None:
        return None
    return {
        **_no_numbers(),
        "gpu": int(mapping.group(1)),
        "tried_bytes": int(mapping.group(2)),
        "free_bytes": int(mapping.group(3)),
        "total_bytes": int(mapping.group(4)),
    }


def _attempting(line: str) -> dict[str, object] | None:
    attempting = _ATTEMPTING.search(line)
    if attempting is None:
        return None
    tried, tried_unit, free, free_unit = attempting.groups()
    return {
        **_no_numbers(),
        "tried_bytes": int(float(tried) * _XLA_UNITS[tried_unit]),
        "free_bytes": int(float(free) * _XLA_UNITS[free_unit]),
    }


def _tried_only(line: str) -> dict[str, object] | None:
    """A message that states the allocation but not the card (XPU's, a cut paste): the size alone."""
    tried = _TRIED.search(line)
    if tried is None:
        return None
    return {**_no_numbers(), "tried_bytes": size_bytes(tried.group(1))}
