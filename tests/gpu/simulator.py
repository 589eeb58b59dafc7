"""The simulator as the vLLM a GPU test's sidecar or doctor reads, started from this checkout, and a bounded wait
for what a test expects of the real processes around it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.loopback import closed_port

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def start_sim(tmp_path: Path, **extra_env: str) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    """`sidecar sim` on a free loopback port, logging to tmp_path/sim.log: the process, its URL, and the
    environment it runs in (this checkout on PYTHONPATH), for the processes started beside it."""
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, **extra_env}
    port = closed_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "sim", "--listen", f"127.0.0.1:{port}"],
        stdout=(tmp_path / "sim.log").open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    return sim, f"http://127.0.0.1:{port}", env


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """`check()` once it is truthy, polled every 0.2 s; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")
