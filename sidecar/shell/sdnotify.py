"""Tell systemd how the daemon is doing (the sd_notify protocol): ready, stopping, status, watchdog. I/O.

One datagram per message to the AF_UNIX socket in `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket),
each line an assignment such as `READY=1`. Without `NOTIFY_SOCKET` (not under systemd, or not `Type=notify`)
every call does nothing. Nothing here raises: a failed send returns one line for the caller to log, because a
notification is never worth stopping the daemon for.

The watchdog (`WatchdogSec=` in the unit) is only worth having when the pings prove the daemon works, so
`run_watchdog` pings only while the caller's `is_alive()` says the daemon's own loop is completing ticks; when
it is stalled the pings stop and systemd restarts the sidecar.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"
USEC_PER_S = 1_000_000


@dataclass(frozen=True, slots=True)
class Notifier:
    """Sends sd_notify messages to `socket_name` (as in NOTIFY_SOCKET); does nothing when it is None."""

    socket_name: str | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        return cls(env.get(NOTIFY_SOCKET_ENV) or None)

    @property
    def enabled(self) -> bool:
        return self.socket_name is not None

    def ready(self, status: str | None = None) -> str | None:
        """`READY=1`: start-up is finished (systemd turns a Type=notify unit `active` only now)."""
        return self.send("READY=1", *_status(status))

    def stopping(self, status: str | None = None) -> str | None:
        return self.send("STOPPING=1", *_status(status))

    def status(self, status: str) -> str | None:
        """A free-form line `systemctl status` shows."""
        return self.send(*_status(status))

    def watchdog(self) -> str | None:
        return self.send("WATCHDOG=1")

    def send(self, *assignments: str) -> str | None:
        """Send one message of `KEY=value` lines. None when sent (or when disabled), else why it failed."""
        if self.socket_name is None:
            return None
        address = _address(self.socket_name)
        if address is None:
            return f"{NOTIFY_SOCKET_ENV}={self.socket_name!r} is neither an absolute path nor an @abstract name"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)  # never wait on a full receive queue: a lost ping beats a frozen loop
                sock.sendto("\n".join(assignments).encode(), address)
        except OSError as error:
            return f"sd_notify to {self.socket_name}: {error.strerror or error}"
        return None


def watchdog_interval_s(environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> float | None:
    """Seconds between watchdog pings: half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises.

    None when there is no watchdog for this process: WATCHDOG_USEC unset or not a positive integer, or
    WATCHDOG_PID naming another process (the variables leaked from a parent).
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get(WATCHDOG_USEC_ENV, ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    watchdog_pid = env.get(WATCHDOG_PID_ENV, "")
    if watchdog_pid:
        try:
            if int(watchdog_pid) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 2 / USEC_PER_S


async def run_watchdog(
    notifier: Notifier,
    *,
    interval_s: float | None,
    is_alive: Callable[[], bool],
    on_error: Callable[[str], None] | None = None,
) -> None:
    """Send `WATCHDOG=1` every `interval_s` while `is_alive()`; until cancelled. Returns at once without a watchdog.

    A stalled daemon gets no pings (and is restarted by systemd); if it recovers first, the pings resume.
    `on_error` hears about every failed send; the caller decides what is worth a log line.
    """
    if interval_s is None or interval_s <= 0 or not notifier.enabled:
        return
    while True:
        if is_alive():
            error = notifier.watchdog()
            if error is not None and on_error is not None:
                on_error(error)
        await asyncio.sleep(interval_s)


def _status(status: str | None) -> tuple[str, ...]:
    if status is None:
        return ()
    # one line: a newline would start another assignment (MAINPID=..., READY=1) in the same message
    return ("STATUS=" + " ".join(status.split()),)


def _address(socket_name: str) -> str | None:
    if socket_name.startswith("@") and len(socket_name) > 1:
        return "\0" + socket_name[1:]
    if socket_name.startswith("/"):
        return socket_name
    return None
