"""A stand-in for vLLM's process tree, for the incident tests: an "API server" whose command line is vLLM's for a
port, and its child titled `VLLM::EngineCore` as vLLM titles it, each waiting in a function a stack names.

Run as a script it is the tree (`python fake_vllm_tree.py vllm.entrypoints.openai.api_server --port N`); the
child is started with argv[0] `VLLM::EngineCore`, which is what /proc/PID/cmdline shows of a setproctitle title.
`FakeVllmTree` starts it in a process group of its own and kills that group when done.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

ENGINE_FUNCTION = "engine_core_busy_loop"
_READY_S = 30.0  # bounds a broken start only: the two processes say when they are in their loops
SERVER_FUNCTION = "api_server_waiting_for_requests"
SECRET_KEY = "sk-fake-tree"  # noqa: S105 - a made-up key an incident must not keep
COMMAND_FLAGS = ("--gpu-memory-utilization", "0.85", "--api-key", SECRET_KEY)


def api_server_waiting_for_requests() -> None:
    print("server ready", flush=True)  # said from inside: a stack taken after it shows this function
    while True:
        time.sleep(0.2)


def engine_core_busy_loop() -> None:
    print("engine ready", flush=True)
    while True:
        time.sleep(0.2)


class FakeVllmTree:
    def __init__(self, port: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "vllm.entrypoints.openai.api_server", "--port", str(port), *COMMAND_FLAGS],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        self.server_pid = self._process.pid
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_lines_into, args=(self._process.stdout, lines), daemon=True).start()
        self.engine_pid = int(lines.get(timeout=_READY_S))
        # Both say so from inside their waiting functions (the engine shares the server's stdout). A fixed 0.5 s
        # was too short in CI run 9 of 2026-11-30: the engine was stopped while still importing.
        ready = {lines.get(timeout=_READY_S).strip() for _ in range(2)}
        assert ready == {"server ready", "engine ready"}, ready
        assert "VLLM::EngineCore" in _cmdline(self.engine_pid)

    def stop_engine(self) -> None:
        os.kill(self.engine_pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.engine_pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
            assert time.monotonic() < deadline, "the fake engine core did not stop"
            time.sleep(0.02)

    def __enter__(self) -> FakeVllmTree:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server_pid, signal.SIGKILL)
        self._process.wait(timeout=10)


def _lines_into(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        engine_core_busy_loop()
    child = subprocess.Popen(["VLLM::EngineCore", __file__, "engine"], executable=sys.executable)
    print(child.pid, flush=True)
    api_server_waiting_for_requests()
