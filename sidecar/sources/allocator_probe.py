"""Reads the allocator probe's files (one per vLLM process, written by the ``vllm_sidecar_probe`` plugin) each tick.

Does I/O: lists and reads ``--probe-dir`` in a worker thread, bounded in the number of files and in each file's
size, and removes the files of processes that are gone. ``read`` never raises.

A sample older than three of the plugin's intervals is stale: its process stopped writing (hung, or killed
without its exit handler) and its numbers are history, never a value. When that process no longer exists the
file is removed (pid namespaces: a process the sidecar cannot see looks gone, so only a stale file is ever
removed; a live process writes its file again within one interval).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.model.allocator import AllocatorReading, ProbeProcess
from sidecar.model.source import SourceResult
from sidecar.parse.probe_file import ProbeFileError, parse_probe_file

SOURCE_NAME = "probe"
MAX_FILES = 256  # far more processes than one vLLM server starts (API servers + engines + workers)
MAX_FILE_BYTES = 64 * 1024  # a sample with 64 devices is about 25 KiB
STALE_INTERVALS = 3.0
_FILE_NAME = re.compile(r"^[1-9][0-9]{0,9}\.json$")


def process_exists(pid: int) -> bool:
    """False only when the kernel says no such process (from here: another pid namespace looks the same)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


class _UnusableError(Exception):
    """A file that gives no sample; ``problem`` is its one line, or None when there is nothing to say."""

    def __init__(self, problem: str | None) -> None:
        super().__init__(problem)
        self.problem = problem


def _load(path: Path) -> ProbeProcess:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise _UnusableError(None) from None  # its process exited (and removed it) between listing and reading
    except OSError as error:
        raise _UnusableError(f"{path.name}: cannot read: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _UnusableError(f"{path.name}: over {MAX_FILE_BYTES // 1024} KiB, not read")
    try:
        process = parse_probe_file(data)
    except ProbeFileError as error:
        raise _UnusableError(f"{path.name}: {error}") from None
    if f"{process.pid}.json" != path.name:
        raise _UnusableError(f"{path.name}: written for pid {process.pid}")
    return process


class AllocatorProbeSource:
    def __init__(
        self,
        *,
        directory: Path,
        timeout_s: float,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        exists: Callable[[int], bool] = process_exists,
    ) -> None:
        self._directory = directory
        self._timeout_s = timeout_s
        self._wall_clock = wall_clock
        self._clock = clock
        self._exists = exists

    async def read(self) -> SourceResult[AllocatorReading]:
        started = self._clock()
        try:
            async with asyncio.timeout(self._timeout_s):
                reading = await asyncio.to_thread(self.scan)
        except TimeoutError:
            return self._result(started, error=f"probe: reading {self._directory} took over {self._timeout_s:g} s")
        except OSError as error:
            return self._result(started, error=f"probe: cannot read {self._directory}: {error.strerror or error}")
        if not reading.processes:
            if reading.problems:
                return self._result(started, error=f"probe: {reading.problems[0]}", reading=reading)
            return self._result(
                started,
                error=(
                    f"probe: no sample in {self._directory} (is vllm-sidecar installed in vLLM's environment, "
                    "with VLLM_SIDECAR_PROBE_DIR set for vLLM and the plugin allowed by VLLM_PLUGINS?)"
                ),
                reading=reading,
            )
        return self._result(started, reading=reading)

    def _result(
        self, started: float, *, error: str | None = None, reading: AllocatorReading | None = None
    ) -> SourceResult[AllocatorReading]:
        value = reading if error is None else None
        return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, value=value, error=error)

    def scan(self) -> AllocatorReading:
        """One pass over the directory (blocking). Raises OSError only when the directory cannot be listed."""
        with os.scandir(self._directory) as entries:
            files = [entry for entry in entries if _FILE_NAME.match(entry.name) and entry.is_file()]
        problems: list[str] = []
        files.sort(key=lambda entry: int(entry.name.removesuffix(".json")))  # the same order, tick after tick
        if len(files) > MAX_FILES:
            problems.append(f"{len(files)} probe files, read the {MAX_FILES} with the lowest pids")
            files = files[:MAX_FILES]
        now_s = self._wall_clock()
        processes: list[ProbeProcess] = []
        for entry in files:
            process, problem = self._read_file(Path(entry.path), now_s)
            if process is not None:
                processes.append(process)
            if problem is not None:
                problems.append(problem)
        return AllocatorReading(processes=tuple(processes), problems=tuple(problems))

    def _read_file(self, path: Path, now_s: float) -> tuple[ProbeProcess | None, str | None]:
        try:
            process = _load(path)
        except _UnusableError as unusable:
            return None, unusable.problem
        age_s = now_s - process.time_unix_s
        if age_s <= STALE_INTERVALS * process.interval_s:
            return process, None
        if not self._exists(process.pid):
            try:
                path.unlink(missing_ok=True)  # its process is gone: nobody else removes it
            except OSError as error:
                return None, (
                    f"{path.name}: its process is gone and the file cannot be removed ({error.strerror or error}): "
                    f"let the sidecar write to {self._directory}"
                )
            return None, None
        return None, f"{path.name}: the {process.role} process stopped sampling {age_s:.0f} s ago (stale)"

    def close(self) -> None:
        """Nothing to release; here so every source closes the same way."""
