"""The allocator derivation over recorded probe readings: sums per GPU and rank, the fragmentation ratio, and
the counters' increase over the short horizon with each process compared with itself."""

from __future__ import annotations

import json

from sidecar.derive.allocator import derive_allocators
from sidecar.model.allocator import AllocatorReading
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.parse.probe_file import parse_probe_file
from tests.probe.documents import GIB, device, document


def _snapshot(at_s: float, *documents: dict[str, object], error: str | None = None) -> Snapshot:
    reading = AllocatorReading(processes=tuple(parse_probe_file(json.dumps(d).encode()) for d in documents))
    return Snapshot(
        monotonic_s=at_s,
        wall_time_s=at_s,
        vllm=SourceResult(source="vllm", duration_s=0.0, error="not read"),
        vllm_healthy=None,
        gpu=None,
        allocator=SourceResult(source="probe", duration_s=0.0, value=None if error else reading, error=error),
    )


def _worker(pid: int, retries: int, ooms: int = 0, rank: int | None = 0, gpu: int = 0) -> dict[str, object]:
    return document(pid, time_unix_s=1.0, rank=rank, devices=[device(gpu, num_alloc_retries=retries, num_ooms=ooms)])


def test_latest_values_and_the_ratio() -> None:
    (derived,) = derive_allocators([_snapshot(0, _worker(10, retries=4))], horizon_polls=5)
    assert (derived.gpu, derived.rank, derived.processes) == (0, "0", 1)
    assert (derived.allocated_bytes, derived.reserved_bytes, derived.inactive_split_bytes) == (
        6 * GIB,
        8 * GIB,
        2 * GIB,
    )
    assert derived.fragmentation_ratio == 0.25
    assert (derived.alloc_retries_total, derived.ooms_total) == (4, 0)
    assert derived.alloc_retries_recent is None  # no sample from the start of the horizon yet


def test_retries_rising_over_the_horizon() -> None:
    history = [_snapshot(t, _worker(10, retries=r)) for t, r in enumerate([0, 0, 1, 3, 3, 7, 9])]
    (derived,) = derive_allocators(reversed(history), horizon_polls=5)
    assert derived.alloc_retries_recent == 9 - 0  # the newest against the one 5 polls back (t=1)
    assert derived.ooms_recent == 0


def test_a_missing_sample_at_the_horizon_uses_the_nearest_older_one() -> None:
    history = [
        _snapshot(0, _worker(10, retries=1)),
        _snapshot(1, error="probe: reading took too long"),
        _snapshot(2, _worker(10, retries=5)),
    ]
    (derived,) = derive_allocators(reversed(history), horizon_polls=1)
    assert derived.alloc_retries_recent == 5 - 1  # t=1 failed: the nearest older sample, t=0


def test_a_restarted_process_is_not_compared_with_its_predecessor() -> None:
    history = [_snapshot(0, _worker(10, retries=50)), _snapshot(1, _worker(11, retries=2))]
    (derived,) = derive_allocators(reversed(history), horizon_polls=1)
    assert derived.alloc_retries_total == 2
    assert derived.alloc_retries_recent is None  # the new process has no sample of its own at the horizon


def test_processes_of_one_gpu_and_rank_add_up_and_ranks_stay_apart() -> None:
    latest = _snapshot(
        0,
        _worker(10, retries=1, rank=None),
        document(11, time_unix_s=1.0, role="engine", rank=None, devices=[device(0, num_ooms=2)]),
        _worker(12, retries=3, rank=1, gpu=1),
    )
    first, second = derive_allocators([latest], horizon_polls=5)
    assert (first.gpu, first.rank, first.processes) == (0, "none", 2)
    assert first.reserved_bytes == 16 * GIB
    assert (first.alloc_retries_total, first.ooms_total) == (1, 2)
    assert (second.gpu, second.rank, second.processes) == (1, "1", 1)


def test_nothing_reserved_has_no_ratio_and_a_failed_read_has_no_values() -> None:
    empty = document(10, time_unix_s=1.0, devices=[device(0, reserved_bytes=0, inactive_split_bytes=0)])
    (derived,) = derive_allocators([_snapshot(0, empty)], horizon_polls=5)
    assert derived.fragmentation_ratio is None
    assert derive_allocators([_snapshot(1, error="probe: stale"), _snapshot(0, empty)], horizon_polls=5) == ()
    assert derive_allocators([], horizon_polls=5) == ()
