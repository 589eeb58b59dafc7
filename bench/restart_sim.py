"""`python -m bench.restart_sim PIDFILE`: the efficacy benchmark's restart command for the exec adapter.

Does I/O: signals the simulator whose PID the benchmark's supervisor keeps in PIDFILE and waits for the
supervisor to have started its successor, like `systemctl restart` returns once the new process runs. The
simulator exits 0 on SIGTERM, which is how the supervisor tells a planned restart from a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

TIMEOUT_S = 60.0


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.restart_sim PIDFILE", file=sys.stderr)
        return 2
    pidfile = Path(argv[0])
    old = _pid(pidfile)
    if old is None:
        print(f"no simulator PID in {pidfile}", file=sys.stderr)
        return 1
    with contextlib.suppress(ProcessLookupError):  # it died on its own: the supervisor is bringing the next one up
        os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        new = _pid(pidfile)
        if new is not None and new != old:
            print(f"restarted the simulator: pid {old} -> {new}")
            return 0
        time.sleep(0.05)
    print(f"the simulator was not restarted within {TIMEOUT_S:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
