"""tests/ports.py: the loopback ports tests pick and bind later lie below the kernel's ephemeral range, and no
two test processes (lanes, xdist workers) draw the same one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests import ports


def test_the_slices_are_disjoint_and_below_the_ephemeral_range() -> None:
    slices = [
        ports.slice_of(lane, worker, ports.FIRST, 32768)
        for lane in range(ports.LANES)
        for worker in range(ports.WORKERS)
    ]
    taken = [port for ports_of_one in slices for port in ports_of_one]
    assert len(taken) == len(set(taken))
    assert min(taken) >= ports.FIRST
    assert max(taken) < 32768
    assert min(len(one) for one in slices) >= 200  # room for every port a test run holds at once


def test_the_ephemeral_range_is_read_from_the_kernels_file() -> None:
    assert ports.ephemeral_start("32768\t60999\n") == 32768
    assert ports.ephemeral_start("49152 65535") == 49152
    assert ports.ephemeral_start(None) == 32768
    assert ports.ephemeral_start("") == 32768


def test_a_pick_is_in_the_process_slice_and_skips_a_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ports.LANE_ENV, "3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(ports, "_PICKS", None)
    own = ports.slice_of(3, 1, ports.FIRST, ports.ephemeral_start(ports.EPHEMERAL_RANGE.read_text()))
    first = ports.free_port()
    assert first in own
    monkeypatch.setattr(ports, "_PICKS", None)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        # the same walk again (the same random start under the test's seed), with that port now in use
        monkeypatch.setattr(ports, "_cycle", lambda ports_of_one: iter([first, *ports_of_one]))
        second = ports.free_port()
    assert second != first
    assert second in own


def test_an_ephemeral_range_that_starts_below_the_slices_falls_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kernels = ports.ephemeral_start(ports.EPHEMERAL_RANGE.read_text())
    assert kernels > ports.FIRST  # this machine's range, which the fallback's port comes from
    claimed = tmp_path / "ip_local_port_range"
    claimed.write_text(f"{ports.FIRST}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", claimed)
    assert ports.free_port() >= kernels
