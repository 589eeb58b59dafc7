"""The numbers of one out-of-memory message, in each format that prints them. Pure.

PyTorch 2.1+'s (`Tried to allocate X. GPU N has a total capacity of T of which F is free. ... this process has P
memory in use. Of the allocated memory A is allocated by PyTorch, and R is reserved by PyTorch but unallocated.`,
with the other processes it lists and the private pools of CUDA graphs), the older `(GPU 0; T total capacity; A
already allocated; F free; R reserved in total by PyTorch)` and its XPU and torch_npu variants, expandable segments'
mapping failure in bytes, and PJRT's `Attempting to allocate X. That was not possible. There are F free.` on a TPU.
Each reader returns the fields of `CudaOom` it could read, or None when the message is not its format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sidecar.doctor.log_records import loose

UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6}
UNITS |= {"GB": 10**9}
SIZE = r"([\d.]+ ?(?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB))"
_DEVICE = r"(CUDA|HIP|XPU|NPU|MPS|MUSA|GPU)"
# PyTorch's allocator with expandable segments, when the driver cannot map more: "expandable_segments: memory
# mapping failed with OOM on device 4 while trying to map 20971520 bytes (free: 17235968, total: 25295323136)".
_MAPPING = loose(
    r"(?:mapping|memory allocation) failed with OOM on device (\d+) while trying to (?:map|allocate) (\d+) bytes "
    r"\(free: (\d+), total: (\d+)\)"
)
_MODERN = loose(
    r"(?:(?:" + _DEVICE + r" out of memory\. )?"  # a quote can start at "Tried", or after it (a trimmed paste)
    + r"Tried to allocate " + SIZE + r"\. )?GPU (\d+)? ?has a total capac(?:i)?ty of " + SIZE
    + r" of which " + SIZE + r" is free\."
)  # fmt: skip
_TRIED = loose(r"Tried to allocate " + SIZE)
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
_THIS_PROCESS = loose(r"(?:this process|\bProcess) has " + SIZE + r" memory in use")  # "Process has": trimmed
_UNALLOCATED = loose(SIZE + r" is reserved by PyTorch but unallocated")
_ALLOCATED = loose(r"Of the allocated memory " + SIZE + r" is allocated by PyTorch")
_PRIVATE_POOLS = loose(r"with " + SIZE + r" allocated in private pools")
_ALLOWED = loose(SIZE + r" allowed;")  # torch.cuda.set_per_process_memory_fraction's cap, when one is set
# torch < 2.1: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.12 MiB
# free; 14.66 GiB reserved in total by PyTorch)"
_LEGACY = loose(
    r"Tried to allocate "
    + SIZE
    + r" \((?:GPU|NPU|XPU) (\d+); "
    + SIZE
    + r" total capacity; "
    + SIZE
    + r" already allocated(?:; (?:[\d.]+ ?\w+ current active; )?(?:"
    + SIZE
    + r" free;? ?)?(?:"
    + SIZE
    + r" reserved in total by PyTorch)?)?\)"
)  # fmt: skip  (XPU's allocator leaves out the free field; torch_npu adds "current active"; a paste may stop at
#    "already allocated)" or at "... free)")
_OTHER_PROCESS = loose(r"Process (\d+) has " + SIZE + r" memory in use")


def size_bytes(text: str) -> int:
    """`1.95 GiB` as PyTorch prints sizes (binary units; GB/MB taken as decimal) to bytes."""
    match = re.fullmatch(r"([\d.]+) ?(\w+)", text.strip())
    if match is None:
        raise ValueError(text)
    return int(float(match.group(1)) * UNITS[match.group(2)])


def message_numbers(payloads: Sequence[str]) -> dict[str, object]:
    """The numbers of the first message (of the family's, latest first) that states a card's figures, else of
    the first that states at least an allocation; else none of them."""
    found = next((got for payload in payloads if (got := _numbers(payload, _modern, _legacy, _mapping))), None)
    found = found or next((got for payload in payloads if (got := _numbers(payload, _attempting, _tried_only))), None)
    return found or _no_numbers()


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
