"""A `Type=notify` service for the real-systemd tests, built on `sidecar.shell.sdnotify`.

It sends READY=1 after `--ready-after-s`, then pings the watchdog while it is "alive" (`--alive-for-s`), then
stalls: the pings stop, as they would when the sidecar's loop stalls, and systemd should restart it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from sidecar.shell.sdnotify import Notifier, run_watchdog, watchdog_interval_s


def report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def serve(*, ready_after_s: float, alive_for_s: float) -> int:
    notifier = Notifier.from_environment()
    await asyncio.sleep(ready_after_s)
    report(f"READY at monotonic {time.monotonic():.6f}")  # one clock for all processes: the test compares
    error = notifier.ready(status="serving")
    if error is not None:
        report(f"READY failed: {error}")
        return 1
    interval_s = watchdog_interval_s()
    report(f"ready; watchdog ping every {interval_s} s for {alive_for_s} s")
    stall_at = time.monotonic() + alive_for_s
    report(f"STALL at monotonic {stall_at:.6f}")
    await run_watchdog(notifier, interval_s=interval_s, is_alive=lambda: time.monotonic() < stall_at, on_error=report)
    report("no watchdog configured")  # run_watchdog only returns without one
    return 2


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-after-s", type=float, required=True)
    parser.add_argument("--alive-for-s", type=float, required=True)
    args = parser.parse_args()
    return asyncio.run(serve(ready_after_s=args.ready_after_s, alive_for_s=args.alive_for_s))


if __name__ == "__main__":
    sys.exit(main())
