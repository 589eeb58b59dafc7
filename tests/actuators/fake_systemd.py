"""A scripted stand-in for systemd's Manager on a private dbus-daemon: answers a test can choose.

Real systemd cannot be made to answer AccessDenied or InteractiveAuthorizationRequired here (the tests run as
root, which polkit always lets through), nor to end a job before the RestartUnit answer reaches the caller; this
stand-in can, over a real bus, so the wire details (error names, match rules, signal before reply) are real.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from jeepney import (
    DBusAddress,
    HeaderFields,
    Message,
    MessageType,
    new_error,
    new_method_call,
    new_method_return,
    new_signal,
)
from jeepney.io.blocking import DBusConnection, open_dbus_connection

MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_INTERFACE = "org.freedesktop.systemd1.Manager"
JOB = "/org/freedesktop/systemd1/job/7"
Behaviour = Literal["error", "job_removed_before_reply", "no_job_removed", "bus_dies"]


def dbus_daemon_missing() -> str | None:
    return None if shutil.which("dbus-daemon") else "dbus-daemon not found (Debian package dbus)"


@dataclass
class FakeSystemd:
    folder: Path
    behaviour: Behaviour
    error_name: str = ""
    job_result: str = "done"
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        socket_path = self.folder / "bus"
        self.address = f"unix:path={socket_path}"
        self._daemon = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--address={self.address}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # "Failed to set fd limit" when not allowed to raise it: harmless
        )
        self._connection = _connect_when_listening(self.address)
        bus = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus")
        request = new_method_call(bus, "RequestName", "su", ("org.freedesktop.systemd1", 4))  # 4: do not queue
        self._connection.send_and_get_reply(request, timeout=5)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._daemon.kill()
        self._daemon.wait()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._connection.close()

    def _serve(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            while True:
                message = self._connection.receive()
                fields = message.header.fields
                if message.header.message_type is not MessageType.method_call:
                    continue
                member = str(fields.get(HeaderFields.member, ""))
                self.calls.append(member)
                if member != "RestartUnit":
                    self._connection.send(new_method_return(message))
                    continue
                self._answer_restart(message)

    def _answer_restart(self, message: Message) -> None:
        if self.behaviour == "error":
            self._connection.send(new_error(message, self.error_name, "s", ("scripted refusal",)))
            return
        emitter = DBusAddress(MANAGER_PATH, interface=MANAGER_INTERFACE)
        job_removed = new_signal(emitter, "JobRemoved", "uoss", (7, JOB, "vllm.service", self.job_result))
        other_job = new_signal(emitter, "JobRemoved", "uoss", (6, JOB[:-1] + "6", "other.service", "failed"))
        if self.behaviour == "job_removed_before_reply":
            self._connection.send(other_job)  # someone else's job: must be ignored
            self._connection.send(job_removed)
        self._connection.send(new_method_return(message, "o", (JOB,)))
        if self.behaviour == "bus_dies":
            time.sleep(0.2)  # let the answer reach the caller first: the bus dies while it waits for the job
            self._daemon.kill()


def _connect_when_listening(address: str) -> DBusConnection:
    deadline = time.monotonic() + 10
    while True:
        try:
            # 10 s, not jeepney's 1: an expired auth deadline surfaces as BlockingIOError on a starved box.
            return open_dbus_connection(address, auth_timeout=10)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
