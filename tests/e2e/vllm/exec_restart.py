"""The restart command the exec adapter runs in the real-vLLM recovery tests: what a user's script does.

`python -m tests.e2e.vllm.exec_restart STATE_DIR PYTHON MODEL PORT`: kill whatever is left of the vLLM it
started last (its whole process group, the EngineCore too: it can outlive its API server), wait until none of
it is left (at most 10 s), start a new vLLM in its own session with its log in STATE_DIR, write its PID and
return at once. The sidecar waits for /health itself. Exit 1 with one line when the old processes will not go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.vllm.server import group_pids, server_command, server_env

GONE_WITHIN_S = 10.0


def main(argv: list[str]) -> int:
    state, python, model, port = Path(argv[0]), argv[1], argv[2], int(argv[3])
    state.mkdir(parents=True, exist_ok=True)
    pid_file = state / "vllm.pid"
    if pid_file.exists():
        old = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old, signal.SIGKILL)  # a dead or hung engine has nothing to finish
        deadline = time.monotonic() + GONE_WITHIN_S
        while group_pids(old):
            if time.monotonic() > deadline:
                print(f"old vLLM processes {group_pids(old)} still there after SIGKILL and {GONE_WITHIN_S:g} s")
                return 1
            time.sleep(0.1)
    starts = len(list(state.glob("vllm-*.log")))
    log = state / f"vllm-{starts}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(python, model, port),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(),
            cwd=state,  # never the repository: the test package `vllm` would shadow vLLM itself
            start_new_session=True,
        )
    pid_file.write_text(str(process.pid))
    print(f"started vLLM pid {process.pid} on port {port}, log {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
