"""A real systemd user manager for tests, in a private mount namespace, with its own session bus.

PID 1 here is not systemd, and `systemd --user` refuses to start unless `/run/systemd/system/` exists. Making
that directory on the host would convince other tools that systemd is PID 1, so the manager runs under
`unshare --mount --propagation private` with a tmpfs on `/run` visible only to it (reference tooling-here.md,
recipe 4.1). Everything else lives in the test's folder: units in `config/systemd/user/`, the runtime
directory in `run/`, where systemd's own `dbus.socket` socket-activates the session bus at `run/bus`.

The manager also gets a cgroup of its own. A user manager takes its cgroup, minus `/init.scope`, as the root
of everything it manages; started from a process in the host's `/init.scope` it would take the whole host
tree as its own and move every process on the machine into `/init.scope`. Under `vllm-sidecar-test-*` it
manages only its units, and two managers (parallel test runs) do not meet.

Needs root (mount, cgroups). Stopped with SIGTERM, which stops its units and exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from jeepney import DBusAddress, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

SYSTEMD = Path("/lib/systemd/systemd")
USER_DBUS_SOCKET_UNIT = Path("/usr/lib/systemd/user/dbus.socket")
CGROUP_ROOT = Path("/sys/fs/cgroup")
MANAGER = DBusAddress(
    "/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1", interface="org.freedesktop.systemd1.Manager"
)
PROPERTIES = DBusAddress(
    "/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1", interface="org.freedesktop.DBus.Properties"
)
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 10.0

# Runs inside the new mount namespace; `exec` keeps the PID, so the Popen's PID is the manager's.
_LAUNCH = """set -e
for dir in $SIDECAR_TEST_CGROUPS; do echo $$ > "$dir/cgroup.procs"; done
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
exec "$SIDECAR_TEST_SYSTEMD" --user
"""


class UserSystemdError(Exception):
    """The manager could not be started or did not answer."""


def missing_requirements() -> str | None:
    """Why a user manager cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (a private mount namespace with a tmpfs on /run, and a cgroup of its own)"
    for tool, package in ((str(SYSTEMD), "systemd"), ("unshare", "util-linux"), ("dbus-daemon", "dbus")):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian package {package})"
    if not USER_DBUS_SOCKET_UNIT.is_file():
        return f"{USER_DBUS_SOCKET_UNIT} not found (Debian package dbus-user-session)"
    return None


@dataclass
class UserSystemd:
    root: Path
    process: subprocess.Popen[bytes]
    cgroups: list[Path]

    @property
    def bus_address(self) -> str:
        return f"unix:path={self.root / 'run' / 'bus'}"

    @property
    def unit_dir(self) -> Path:
        return self.root / "config" / "systemd" / "user"

    @property
    def log_path(self) -> Path:
        return self.root / "manager.log"

    def write_unit(self, name: str, text: str) -> Path:
        """Write a unit file and make the manager read it (daemon-reload)."""
        path = self.unit_dir / name
        path.write_text(text)
        self.call("Reload")
        return path

    def call(self, method: str, signature: str | None = None, *args: object) -> tuple[object, ...]:
        """A blocking call on the Manager interface; raises UserSystemdError on a D-Bus error."""
        return self._call(new_method_call(MANAGER, method, signature, args))

    def manager_property(self, name: str) -> object:
        (variant,) = self._call(new_method_call(PROPERTIES, "Get", "ss", (MANAGER.interface, name)))
        return variant[1] if isinstance(variant, tuple) else variant

    def unit_property(self, unit: str, name: str, interface: str = "org.freedesktop.systemd1.Unit") -> object:
        """A property of a loaded unit (`ActiveExitTimestampMonotonic`, say), as systemd itself recorded it."""
        (path,) = self.call("GetUnit", "s", unit)
        properties = DBusAddress(str(path), bus_name=PROPERTIES.bus_name, interface=PROPERTIES.interface)
        (variant,) = self._call(new_method_call(properties, "Get", "ss", (interface, name)))
        return variant[1] if isinstance(variant, tuple) else variant

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no manager log)"

    def stop(self) -> None:
        """SIGTERM (the manager stops its units and exits); SIGKILL and cgroup.kill if it does not."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for cgroup in self.cgroups:
            kill = cgroup / "cgroup.kill"  # cgroup v2 only: whatever the manager left behind
            if kill.exists():
                with contextlib.suppress(OSError):
                    kill.write_text("1")
        _remove_cgroups(self.cgroups)

    def _call(self, message: object) -> tuple[object, ...]:
        # jeepney authenticates within 1 s by default; past it, its deadline leaves the socket non-blocking and
        # the starved box sees BlockingIOError from recv, not a timeout (CI run 44).
        with open_dbus_connection(self.bus_address, auth_timeout=CALL_TIMEOUT_S) as connection:
            reply = connection.send_and_get_reply(message, timeout=CALL_TIMEOUT_S)
        if reply.header.message_type is MessageType.error:
            raise UserSystemdError(f"D-Bus error: {reply.body}")
        return tuple(reply.body)


def start_user_systemd(root: Path) -> UserSystemd:
    """Start a user manager rooted at `root` and wait until it has finished starting up."""
    for folder in ("run", "home", "config/systemd/user"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "run").chmod(0o700)
    cgroups = _make_cgroups(f"vllm-sidecar-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(root / "home"),
        "XDG_RUNTIME_DIR": str(root / "run"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={root / 'run' / 'bus'}",
        "SIDECAR_TEST_CGROUPS": " ".join(str(cgroup) for cgroup in cgroups),
        "SIDECAR_TEST_SYSTEMD": str(SYSTEMD),
    }
    with (root / "manager.log").open("wb") as log:
        process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _LAUNCH],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for pytest must not reach the manager first
        )
    manager = UserSystemd(root=root, process=process, cgroups=cgroups)
    try:
        _wait_until_running(manager)
    except BaseException:
        manager.stop()
        raise
    return manager


def _wait_until_running(manager: UserSystemd) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last_error = "the bus socket did not appear"
    while time.monotonic() < deadline:
        if manager.process.poll() is not None:
            raise UserSystemdError(f"systemd --user exited with {manager.process.returncode}:\n{manager.log_tail()}")
        if (manager.root / "run" / "bus").is_socket():
            try:
                # the bus may answer before the manager has connected to it or finished its start-up jobs
                if manager.manager_property("SystemState") in ("running", "degraded"):
                    return
                last_error = "SystemState is not yet running"
            except (OSError, EOFError, TimeoutError, UserSystemdError) as error:
                last_error = f"{type(error).__name__}: {error}"
        time.sleep(0.05)
    raise UserSystemdError(
        f"systemd --user not running after {START_TIMEOUT_S} s ({last_error}):\n{manager.log_tail()}"
    )


def _make_cgroups(name: str) -> list[Path]:
    """A cgroup called `name` in each hierarchy systemd tracks processes in; [] where that is not possible."""
    hybrid = [CGROUP_ROOT / "unified", CGROUP_ROOT / "systemd"]
    parents = [parent for parent in hybrid if (parent / "cgroup.procs").is_file()]
    if not parents and (CGROUP_ROOT / "cgroup.controllers").is_file():
        parents = [CGROUP_ROOT]  # pure cgroup v2
    made: list[Path] = []
    try:
        for parent in parents:
            (parent / name).mkdir()
            made.append(parent / name)
    except OSError:
        _remove_cgroups(made)  # read-only cgroupfs (an unprivileged container): run without isolation
        return []
    return made


def _remove_cgroups(cgroups: list[Path]) -> None:
    """Remove each cgroup and what the manager made under it, deepest first (a cgroup goes once it is empty)."""
    for cgroup in cgroups:
        deadline = time.monotonic() + 5.0
        while cgroup.exists() and time.monotonic() < deadline:
            folders = sorted((path for path in cgroup.rglob("*") if path.is_dir()), key=lambda p: -len(p.parts))
            for folder in [*folders, cgroup]:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if cgroup.exists():
                time.sleep(0.05)
