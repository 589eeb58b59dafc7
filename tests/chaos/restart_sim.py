"""A restart command for the exec adapter that really restarts a simulator, and keeps a witness of each restart.

    python tests/chaos/restart_sim.py FOLDER            # the exec adapter's command: restart the sim
    python tests/chaos/restart_sim.py FOLDER --start    # the test's first start

FOLDER holds `sim.json` (the simulator's arguments, written by the test), `sim.pid`, `sim.log`, and
`restarts.log`, one line per restart this command performed: the witness a test counts restarts with (and
`begun.log`, one line per call, written before the delay),
independent of anything the sidecar says. With `--delay-s` it waits before acting, like a slow platform (a
systemd job stopping a vLLM with hung connections); it runs in its own session, so it finishes even when the
sidecar that started it is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # a hung engine does not stop politely; SIGKILL is what systemd ends with
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running, not a zombie: the orphaned simulator's reaper may not be quick (or may not exist here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _start(folder: Path) -> int:
    args = json.loads((folder / "sim.json").read_text())
    with (folder / "sim.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "sim", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
    (folder / "sim.pid").write_text(str(process.pid))
    return process.pid


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--start", action="store_true", help="first start: no restart is recorded")
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args()
    folder: Path = args.folder
    if args.start:
        _start(folder)
        return 0
    with (folder / "begun.log").open("a") as begun:  # the adapter has called: a test may kill its sidecar now
        begun.write(f"{time.time():.3f}\n")
    time.sleep(args.delay_s)
    _stop(folder / "sim.pid")
    pid = _start(folder)
    with (folder / "restarts.log").open("a") as witness:
        witness.write(f"{time.time():.3f} {pid} {os.environ.get('VLLM_SIDECAR_RESTART_REASON', '')}\n")
    with contextlib.suppress(BrokenPipeError, OSError):
        print(f"simulator restarted as pid {pid}", flush=True)  # the adapter's detail, if it is still reading
    return 0


if __name__ == "__main__":
    sys.exit(main())
