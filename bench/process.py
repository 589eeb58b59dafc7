"""Child processes of the benchmarks: start them, read their CPU time and peak memory from /proc, stop them.

Does I/O (subprocesses, /proc, loopback HTTP). CPU time comes from /proc/<pid>/task/*/schedstat, which the
kernel keeps in nanoseconds; utime + stime in /proc/<pid>/stat count 10 ms clock ticks, too coarse for a
tick that costs a millisecond or two. Both count every thread of the process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import httpx


def free_port() -> int:
    """A free loopback port (bound, then released for a child process to take)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far, in seconds (nanosecond resolution where the kernel has it)."""
    total_ns = 0
    found = False
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total_ns += int((task / "schedstat").read_text().split()[0])
                found = True
    if found:
        return total_ns / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline_rss_mb() -> float:
    """Peak RSS of an interpreter that only imports the daemon's libraries: the floor the daemon builds on."""
    code = (
        "import httpx, prometheus_client, structlog, apscheduler, pydantic_settings, pynvml, yaml, pathlib;"
        "print([l for l in pathlib.Path('/proc/self/status').read_text().splitlines() if l.startswith('VmHWM')][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.split()[1]) / 1024


class Child:
    """`python -m sidecar ...` as a child process, its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log: IO[str] = log_path.open("a")
        full_env = {**os.environ, **(env or {})}
        for name in [name for name in full_env if name.startswith("VLLM_SIDECAR_")]:
            del full_env[name]  # the benchmark sets every option it relies on; nothing leaks in from outside
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sidecar", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


def http_status(url: str, timeout_s: float = 1.0) -> int | None:
    """The status code of GET `url`, or None when nothing answered."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code
    except httpx.HTTPError:
        return None
