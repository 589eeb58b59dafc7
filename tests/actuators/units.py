"""Unit files for the real-systemd tests, and small waits shared by them."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
NOTIFY_SERVICE = Path(__file__).with_name("notify_service.py")


def exec_arg(value: str) -> str:
    """One argument of an Exec*= line, quoted for systemd: `%` starts a specifier and `$` a variable there."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def env_assignment(name: str, value: str) -> str:
    """An Environment= line: quoted, specifiers escaped (no `$` expansion happens there)."""
    escaped = f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'Environment="{escaped}"'


def service(*lines: str, description: str) -> str:
    return "\n".join(["[Unit]", f"Description={description}", "", "[Service]", *lines, ""])


def python_lines(*args: str) -> list[str]:
    """ExecStart= running this interpreter with `args`, able to import the sidecar from this checkout."""
    return [
        "ExecStart=" + " ".join(exec_arg(arg) for arg in (sys.executable, *args)),
        env_assignment("PYTHONPATH", str(REPO)),
        env_assignment("PYTHONUNBUFFERED", "1"),
        "WorkingDirectory=" + str(REPO).replace("%", "%%"),
    ]


def sim_unit(port: int) -> str:
    """The project's vLLM simulator as a plain service, the way vLLM itself is run."""
    return service(
        "Type=exec",
        *python_lines("-m", "sidecar", "sim", "--listen", f"127.0.0.1:{port}"),
        description="simulated vLLM for the systemd actuator tests",
    )


def notify_unit(*, ready_after_s: float, alive_for_s: float, watchdog_s: float, log: Path) -> str:
    """A Type=notify service with a watchdog, restarted by systemd when the watchdog fires."""
    return service(
        "Type=notify",
        *python_lines(str(NOTIFY_SERVICE), "--ready-after-s", str(ready_after_s), "--alive-for-s", str(alive_for_s)),
        f"WatchdogSec={watchdog_s}",
        "Restart=on-watchdog",
        "RestartSec=100ms",
        "LimitCORE=0",  # the watchdog kills with SIGABRT; no core files in the test folder
        f"StandardError=append:{log}",
        description="sd_notify readiness and watchdog test service",
    )


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str, every_s: float = 0.05
) -> float:
    """Poll `predicate` until it holds; return the seconds it took. Fails the test with `what` otherwise."""
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(every_s)
    return time.monotonic() - started


def process_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def sim_healthy(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            return (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200
    except httpx.HTTPError:
        return False
