"""PyTorch's CUDA allocator per GPU and rank, from the allocator probe's samples. Pure.

The counters (retries, OOMs) count since each vLLM process started, so their increase over the short horizon
compares a process with itself: a process that is new within the horizon (a restart) adds nothing until it has
two samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.model.allocator import AllocatorDevice, AllocatorReading
from sidecar.model.derived import AllocatorDerived
from sidecar.model.snapshot import Snapshot

NO_RANK = "none"

_Key = tuple[int, str]  # (gpu, rank)


@dataclass(slots=True)
class _Sums:
    processes: int = 0
    allocated: int = 0
    reserved: int = 0
    inactive_split: int = 0
    retries: int = 0
    ooms: int = 0
    retries_recent: int | None = None
    ooms_recent: int | None = None


def _devices(reading: AllocatorReading) -> Iterable[tuple[int, _Key, AllocatorDevice]]:
    for process in reading.processes:
        rank = NO_RANK if process.rank is None else str(process.rank)
        for device in process.devices:
            yield process.pid, (device.index, rank), device


def _reading(snapshot: Snapshot) -> AllocatorReading | None:
    result = snapshot.allocator
    if result is None or result.error is not None:
        return None
    return result.value


def derive_allocators(newest_first: Iterable[Snapshot], *, horizon_polls: int) -> tuple[AllocatorDerived, ...]:
    """From the window's snapshots, newest first: the latest sample of every GPU and rank, and the counters'
    increase since the snapshot ``horizon_polls`` polls back (the nearest older one with a sample of the
    process, if that one has none)."""
    snapshots = iter(newest_first)
    latest = next(snapshots, None)
    reading = _reading(latest) if latest is not None else None
    if reading is None:
        return ()
    sums: dict[_Key, _Sums] = {}
    for _, key, device in _devices(reading):
        total = sums.setdefault(key, _Sums())
        total.processes += 1
        total.allocated += device.allocated_bytes
        total.reserved += device.reserved_bytes
        total.inactive_split += device.inactive_split_bytes
        total.retries += device.alloc_retries
        total.ooms += device.ooms
    before: dict[tuple[int, int], AllocatorDevice] = {}
    for number, snapshot in enumerate(snapshots, start=1):
        older = _reading(snapshot) if number >= horizon_polls else None
        if older is not None:
            before = {(pid, device.index): device for pid, _, device in _devices(older)}
            break
    for pid, key, device in _devices(reading):
        then = before.get((pid, device.index))
        if then is None:
            continue
        total = sums[key]
        # max(): a counter of one process never falls; if it does, the file is not what it claims to be
        total.retries_recent = (total.retries_recent or 0) + max(0, device.alloc_retries - then.alloc_retries)
        total.ooms_recent = (total.ooms_recent or 0) + max(0, device.ooms - then.ooms)
    return tuple(
        AllocatorDerived(
            gpu=gpu,
            rank=rank,
            processes=total.processes,
            allocated_bytes=total.allocated,
            reserved_bytes=total.reserved,
            inactive_split_bytes=total.inactive_split,
            fragmentation_ratio=total.inactive_split / total.reserved if total.reserved > 0 else None,
            alloc_retries_total=total.retries,
            ooms_total=total.ooms,
            alloc_retries_recent=total.retries_recent,
            ooms_recent=total.ooms_recent,
        )
        for (gpu, rank), total in sorted(sums.items())
    )
