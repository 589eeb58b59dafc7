"""The allocator probe source against a real directory: freshness, dead pids, bounds, bad files, a missing
directory. The clock and the pid check are injected (timing logic on virtual time)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sidecar.sources import allocator_probe
from sidecar.sources.allocator_probe import MAX_FILE_BYTES, AllocatorProbeSource, process_exists
from tests.probe.documents import document, write

NOW = 1_000_000.0


def _source(folder: Path, alive: set[int] | None = None, now: float = NOW) -> AllocatorProbeSource:
    return AllocatorProbeSource(
        directory=folder,
        timeout_s=5,
        wall_clock=lambda: now,
        exists=(lambda pid: pid in alive) if alive is not None else (lambda _pid: True),
    )


def test_fresh_files_are_read_in_pid_order(tmp_path: Path) -> None:
    write(tmp_path, document(30, time_unix_s=NOW - 1))
    write(tmp_path, document(12, time_unix_s=NOW - 5.9, role="api", rank=None, devices=[]))
    result = asyncio.run(_source(tmp_path).read())
    assert result.ok, result.error
    assert result.source == "probe"
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [12, 30]
    assert result.value.problems == ()


def test_a_stale_file_of_a_live_process_is_a_failure_never_a_value(tmp_path: Path) -> None:
    write(tmp_path, document(30, time_unix_s=NOW - 1))
    stale = write(tmp_path, document(31, time_unix_s=NOW - 6.1))  # three intervals of 2 s: 6 s
    result = asyncio.run(_source(tmp_path, alive={30, 31}).read())
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [30]
    assert result.value.problems == ("31.json: the worker process stopped sampling 6 s ago (stale)",)
    assert stale.exists()  # its process lives: it may write again


def test_the_stale_file_of_a_process_that_is_gone_is_removed(tmp_path: Path) -> None:
    stale = write(tmp_path, document(31, time_unix_s=NOW - 60))
    fresh_of_unseen = write(tmp_path, document(32, time_unix_s=NOW - 1))  # another pid namespace looks gone
    result = asyncio.run(_source(tmp_path, alive=set()).read())
    assert not stale.exists()
    assert fresh_of_unseen.exists()
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [32]
    assert result.value.problems == ()


def test_only_stale_files_leave_no_value(tmp_path: Path) -> None:
    write(tmp_path, document(31, time_unix_s=NOW - 60))
    result = asyncio.run(_source(tmp_path).read())
    assert not result.ok
    assert result.error == "probe: 31.json: the worker process stopped sampling 60 s ago (stale)"


def test_an_empty_directory_says_what_to_check(tmp_path: Path) -> None:
    result = asyncio.run(_source(tmp_path).read())
    assert result.error is not None
    assert "no sample in" in result.error
    assert "VLLM_SIDECAR_PROBE_DIR" in result.error
    assert "VLLM_PLUGINS" in result.error


def test_a_missing_directory_is_an_error_not_an_exception(tmp_path: Path) -> None:
    result = asyncio.run(_source(tmp_path / "absent").read())
    assert result.error == f"probe: cannot read {tmp_path / 'absent'}: No such file or directory"


def test_bad_files_are_named_and_skipped(tmp_path: Path) -> None:
    write(tmp_path, document(30, time_unix_s=NOW))
    (tmp_path / "40.json").write_text('{"pid": 40}')
    (tmp_path / "41.json").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    write(tmp_path, document(42, time_unix_s=NOW)).rename(tmp_path / "43.json")
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / ".44.json.tmp").write_text("a write in progress")
    (tmp_path / "45.json").mkdir()
    result = asyncio.run(_source(tmp_path).read())
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [30]
    assert result.value.problems == (
        "40.json: role is not api, engine, worker or other: None",
        "41.json: over 64 KiB, not read",
        "43.json: written for pid 42",
    )


def test_the_number_of_files_read_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator_probe, "MAX_FILES", 3)
    for pid in (9, 5, 7, 3, 11):
        write(tmp_path, document(pid, time_unix_s=NOW))
    result = asyncio.run(_source(tmp_path).read())
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [3, 5, 7]
    assert result.value.problems == ("5 probe files, read the 3 with the lowest pids",)


def test_a_slow_directory_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = AllocatorProbeSource(directory=tmp_path, timeout_s=0.05)
    release = asyncio.Event()

    async def slow_to_thread(*_args: object) -> None:
        await release.wait()

    monkeypatch.setattr(asyncio, "to_thread", slow_to_thread)
    result = asyncio.run(source.read())
    assert result.error == f"probe: reading {tmp_path} took over 0.05 s"


def test_process_exists_tells_live_from_gone() -> None:
    assert process_exists(os.getpid())
    assert process_exists(1)  # init: exists, whoever owns it
    assert not process_exists(2**22 + 12345)  # above pid_max's default ceiling


def test_a_file_that_cannot_be_removed_is_named_and_the_rest_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, document(30, time_unix_s=NOW - 1))
    gone = write(tmp_path, document(31, time_unix_s=NOW - 60))

    def refuse(path: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(path))  # vLLM's directory, not writable by the sidecar

    monkeypatch.setattr(Path, "unlink", refuse)
    result = asyncio.run(_source(tmp_path, alive={30}).read())
    assert gone.exists()
    assert result.value is not None
    assert [process.pid for process in result.value.processes] == [30]
    assert result.value.problems == (
        f"31.json: its process is gone and the file cannot be removed (Permission denied): "
        f"let the sidecar write to {tmp_path}",
    )
