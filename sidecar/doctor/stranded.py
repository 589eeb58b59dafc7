"""Memory PyTorch's caching allocator reserved but could not use: stranded in split pieces, where an OOM message
states it ("X is reserved by PyTorch but unallocated"). The test both the budget's readings and the others use,
and its evidence. Pure.
"""

from __future__ import annotations

from sidecar.doctor.formula import gib
from sidecar.doctor.logfacts import CudaOom
from sidecar.doctor.overshoot import MIN_STRANDED_BYTES

MIN_SLACK_BYTES = 64 * 2**20  # stranded memory under this is the caching allocator's ordinary slack
STRANDED_MARGIN = 4  # a small shortfall is fragmentation when the stranded memory holds it this many times


def stranded(oom: CudaOom) -> bool:
    """The stranded memory would have held what the allocation lacked, with room: at least 256 MiB, or, for a
    small shortfall, four times it (and more than the allocator's usual 64 MiB of slack)."""
    stranded = oom.reserved_unallocated_bytes
    shortfall = oom.shortfall_bytes
    if stranded is None or shortfall is None or stranded < shortfall:
        return False
    return stranded >= MIN_STRANDED_BYTES or stranded >= max(MIN_SLACK_BYTES, STRANDED_MARGIN * shortfall)


def stranded_line(oom: CudaOom) -> str:
    return (
        f"{gib(oom.reserved_unallocated_bytes or 0)} reserved by PyTorch but unallocated, at least the "
        f"{gib(oom.shortfall_bytes or 0)} the {gib(oom.tried_bytes or 0)} allocation lacked "
        f"({gib(oom.free_bytes or 0)} free): the memory was there, split into pieces too small"
    )


def stranded_why(oom: CudaOom) -> str:
    return (
        f"{gib(oom.reserved_unallocated_bytes or 0)} stranded >= {gib(oom.shortfall_bytes or 0)} short: expandable "
        "segments let PyTorch's allocator grow a segment in place instead of stranding split ones (PyTorch's own "
        "OOM message suggests it)"
    )
