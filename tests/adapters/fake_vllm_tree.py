"""A stand-in for vLLM's process tree, for the incident tests: an "API server" whose command line is vLLM's for a
port, and its child titled `VLLM::EngineCore` as vLLM titles it, each waiting in a function a stack names.

Run as a script it is the tree (`python fake_vllm_tree.py vllm.entrypoints.openai.api_server --port N`); the
child is started with argv[0] `VLLM::EngineCore`, which is what /proc/PID/cmdline shows of a setproctitle title.
`FakeVllmTree` starts it in a process group of its own and kills that group when done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

ENGINE_FUNCTION = "engine_core_busy_loop"
SERVER_FUNCTION = "api_server_waiting_for_requests"


def api_server_waiting_for_requests() -> None:
    while True:
        time.sleep(0.2)


def engine_core_busy_loop() -> None:
    while True:
        time.sleep(0.2)


class FakeVllmTree:
    def __init__(self, port: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "vllm.entrypoints.openai.api_server", "--port", str(port)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        self.server_pid = self._process.pid
        self.engine_pid = int(self._process.stdout.readline())
        deadline = time.monotonic() + 20
        while "VLLM::EngineCore" not in _cmdline(self.engine_pid):  # the child has exec'd
            assert time.monotonic() < deadline, "the fake engine core did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # both are in their waiting functions by now

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
