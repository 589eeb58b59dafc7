"""A whole Debian system booted in systemd-nspawn: PID 1 systemd, its system bus, polkitd. I/O (processes, D-Bus).

The host's PID 1 is not systemd, so the deployment files are tested on a system manager booted in a container
(reference tooling-here.md, recipe 4.2). The container shares the host's network (no --private-network): the
test reaches the sidecar and the simulated vLLM on loopback. Its /run/dbus is a host folder, so the host talks
to the container's system bus through `<bus_dir>/system_bus_socket`, as root (which systemd lets do anything).
Commands inside run through nsenter into the container's namespaces, optionally as another user: that is how a
call is made as `vllm-sidecar` and goes through polkit.

Stopped with SIGTERM (the container powers off cleanly in about 2 s). nspawn leaves
`/run/systemd/nspawn/propagate/<machine>` behind on a host whose /run is not a tmpfs; `stop` removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

SYSTEMD_BUS_NAME = "org.freedesktop.systemd1"
MANAGER = DBusAddress("/org/freedesktop/systemd1", bus_name=SYSTEMD_BUS_NAME, interface=f"{SYSTEMD_BUS_NAME}.Manager")
UNIT_INTERFACE = f"{SYSTEMD_BUS_NAME}.Unit"
SERVICE_INTERFACE = f"{SYSTEMD_BUS_NAME}.Service"
BOOT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 10.0
NSPAWN_RUN_DIR = Path("/run/systemd/nspawn")
TOOLS = (("systemd-nspawn", "systemd-container"), ("nsenter", "util-linux"))


class ContainerError(Exception):
    """The container did not boot, or its manager did not answer."""


class BusCallError(Exception):
    """systemd answered a D-Bus call with an error."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def missing_requirements() -> str | None:
    """Why a container cannot be booted here, or None."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn)"
    for tool, package in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian package {package})"
    return None


@dataclass
class Container:
    root: Path
    machine: str
    bus_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    leader: int = 0  # the container's PID 1, as the host numbers it

    @property
    def bus_address(self) -> str:
        return f"unix:path={self.bus_dir / 'system_bus_socket'}"

    # --- D-Bus, from the host, as root -----------------------------------------------------------------------

    def call(self, method: str, signature: str | None = None, *args: object) -> tuple[object, ...]:
        """A call on systemd's Manager interface; raises BusCallError when systemd answers with an error."""
        return self._call(new_method_call(MANAGER, method, signature, args))

    def manager_property(self, name: str) -> object:
        return self._get(MANAGER.object_path, MANAGER.interface, name)

    def unit_property(self, unit: str, name: str, interface: str = UNIT_INTERFACE) -> object:
        """`systemctl show -p NAME UNIT`, read over the bus (the variant's value)."""
        (path,) = self.call("LoadUnit", "s", unit)
        return self._get(str(path), interface, name)

    def service_property(self, unit: str, name: str) -> object:
        return self.unit_property(unit, name, SERVICE_INTERFACE)

    def main_pid(self, unit: str) -> int:
        """The service's main PID as the container numbers it; 0 while it has none."""
        pid = self.service_property(unit, "MainPID")
        assert isinstance(pid, int)
        return pid

    def _get(self, path: str, interface: str, name: str) -> object:
        properties = DBusAddress(path, bus_name=SYSTEMD_BUS_NAME, interface="org.freedesktop.DBus.Properties")
        (variant,) = self._call(new_method_call(properties, "Get", "ss", (interface, name)))
        return variant[1] if isinstance(variant, tuple) else variant  # jeepney: a variant is (signature, value)

    def _call(self, message: object) -> tuple[object, ...]:
        # jeepney authenticates within 1 s by default; past it, its deadline leaves the socket non-blocking and
        # the starved box sees BlockingIOError from recv, not a timeout (CI run 44).
        with open_dbus_connection(self.bus_address, auth_timeout=CALL_TIMEOUT_S) as connection:
            reply = connection.send_and_get_reply(message, timeout=CALL_TIMEOUT_S)
        if reply.header.message_type is MessageType.error:
            name = str(reply.header.fields.get(HeaderFields.error_name, "unknown error"))
            raise BusCallError(name, str(reply.body[0]) if reply.body else "")
        return tuple(reply.body)

    # --- commands inside ------------------------------------------------------------------------------------

    def run(
        self, *argv: str, user: str | None = None, check: bool = True, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the container (all its namespaces, its root), as root or as `user`."""
        command = ["nsenter", f"--target={self.leader}", "--all", "--"]
        if user is not None:
            # setpriv, not runuser/su: no PAM session, so the process is exactly "a process of that user"
            uid, gid = self.ids(user)
            command += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--"]
        command += argv
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and result.returncode != 0:
            raise ContainerError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def ids(self, user: str) -> tuple[int, int]:
        """The UID and primary GID of `user` in the container's /etc/passwd."""
        for line in self.read("/etc/passwd").splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
        raise ContainerError(f"no user {user} in the container")

    def journal(self, unit: str) -> str:
        """The unit's journal for this boot: systemd's own lines about it and its output."""
        return self.run("journalctl", "--no-pager", "--boot", "--output=cat", f"--unit={unit}").stdout

    def read(self, path: str) -> str:
        """A file of the container's file system (read from the host)."""
        return (self.root / path.lstrip("/")).read_text()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no container log)"

    def stop(self) -> None:
        """SIGTERM (the container halts); SIGKILL if it does not. Then nspawn's leftovers on the host."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove_leftovers(self.machine)


def boot(root: Path, *, machine: str, bus_dir: Path, log_path: Path, options: Sequence[str] = ()) -> Container:
    """Boot the system in `root` and wait until its manager has finished starting up; `options` go to nspawn
    (`--volatile=overlay` boots a shared root file system without changing it)."""
    bus_dir.mkdir(parents=True, exist_ok=True)
    command = [
        *("systemd-nspawn", f"--directory={root}", f"--machine={machine}", "--boot"),
        # no machined on the host: nothing to register with, and the container stays in our process tree
        *("--register=no", "--keep-unit"),
        # the host's journal folder is no business of the test; its console goes to the log file
        *("--link-journal=no", "--console=pipe", "--resolv-conf=off", "--timezone=off"),
        f"--bind={bus_dir}:/run/dbus",
        *options,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for pytest must not reach the container first
        )
    container = Container(root=root, machine=machine, bus_dir=bus_dir, log_path=log_path, process=process)
    try:
        container.leader = _wait_for_leader(container)
        _wait_until_running(container)
    except BaseException:
        container.stop()
        raise
    return container


def remove_leftovers(machine: str) -> None:
    """What nspawn could not remove for `machine` (only ours: other containers may be running)."""
    for leftover in NSPAWN_RUN_DIR.glob(f"*/{machine}"):
        shutil.rmtree(leftover, ignore_errors=True)


def _wait_for_leader(container: Container) -> int:
    """The container's PID 1: the child of systemd-nspawn that is PID 1 of its own PID namespace."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if container.process.poll() is not None:
            raise ContainerError(f"systemd-nspawn exited with {container.process.returncode}:\n{container.log_tail()}")
        for child in _children(container.process.pid):
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{child}/status").read_text()
                namespaced = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
                if len(namespaced) > 1 and namespaced[-1] == "1":
                    return child
        time.sleep(0.05)
    raise ContainerError(f"no container init after {BOOT_TIMEOUT_S} s:\n{container.log_tail()}")


def _children(pid: int) -> list[int]:
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _wait_until_running(container: Container) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    last_error = "the system bus socket did not appear"
    while time.monotonic() < deadline:
        if container.process.poll() is not None:
            raise ContainerError(f"systemd-nspawn exited with {container.process.returncode}:\n{container.log_tail()}")
        if (container.bus_dir / "system_bus_socket").is_socket():
            try:
                # the bus answers before the manager has finished its start-up jobs (then: running, or degraded)
                state = container.manager_property("SystemState")
                if state in ("running", "degraded"):
                    return
                last_error = f"SystemState is {state}"
            except (OSError, EOFError, TimeoutError, BusCallError) as error:
                last_error = f"{type(error).__name__}: {error}"
        time.sleep(0.1)
    raise ContainerError(f"systemd not running after {BOOT_TIMEOUT_S} s ({last_error}):\n{container.log_tail()}")
