"""What the systemd adapter can learn at start without acting on anything. I/O (D-Bus, through jeepney).

Asked once, before the daemon starts, so that a sidecar which could never restart vLLM stops with one line
instead of finding out in its first incident: the bus answers, a systemd manager is on it, and the manager
knows the unit and could load its file. Loading a unit and reading its properties need no authorization.

The right to restart is known without asking where no polkit is involved: root may always, and a user manager
obeys its own user (whose bus the sidecar then is on). A non-root caller on the system bus is allowed through
polkit, and polkit cannot be asked beforehand: it answers a CheckAuthorization that carries the unit and verb
(what deploy/systemd/50-vllm-sidecar.rules decides on) only to root or to the action's owner ("Only trusted
callers (e.g. uid 0 or an action owner) can use CheckAuthorization() and pass details", polkitd 122), and
without them that rule says no. So that right is reported as not known, rather than guessed; the first
restart's outcome carries polkit's answer.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sidecar.actuators.dbus import BusLostError, BusUnavailableError, DbusCallError, DbusSession, Target
from sidecar.actuators.systemd import MANAGER, SERVICE_INTERFACE, SYSTEMD_BUS_NAME, UNIT_INTERFACE, SystemdActuator
from sidecar.model.remediation import FLAGS_VARIABLE

CHECK_TIMEOUT_S = 10.0
SYSTEM_BUS_DEFAULT = "unix:path=/var/run/dbus/system_bus_socket"  # jeepney's, and libdbus's, without the variable
_NO_MANAGER_ERRORS = frozenset(
    {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
)


class StartCheckError(Exception):
    """Restarts through systemd cannot work as set up; the message is one line ending in what to do.

    `bus`: the bus or the manager on it is the trouble (the machine, or --systemd-bus); otherwise the unit."""

    def __init__(self, message: str, *, bus: bool) -> None:
        super().__init__(message)
        self.bus = bus


async def check_systemd(actuator: SystemdActuator, *, uid: int, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Raise StartCheckError when a restart could not work; return what could not be checked (one line), or
    None when nothing is left unknown. Bounded by `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            await _check_unit(actuator)
    except TimeoutError:
        raise StartCheckError(
            f"systemd on the {actuator.bus} bus did not answer within {timeout_s:g} s about {actuator.unit}; "
            "see `systemctl status` (a manager that busy at start will not restart vLLM in time either)",
            bus=True,
        ) from None
    if uid == 0 or actuator.bus == "user":
        return None
    return (
        f"whether uid {uid} may restart {actuator.unit} is polkit's to say, and it tells only root beforehand: "
        "without a rule such as deploy/systemd/50-vllm-sidecar.rules for this user, the first restart is refused"
    )


async def _check_unit(actuator: SystemdActuator) -> None:
    try:
        session = await DbusSession.open(actuator.address)
    except BusUnavailableError as error:
        raise StartCheckError(_unreachable(actuator, error), bus=True) from None
    try:
        (path,) = await session.call(MANAGER, "LoadUnit", "s", actuator.unit)
        unit = Target(bus_name=SYSTEMD_BUS_NAME, path=str(path), interface=UNIT_INTERFACE)
        load_state = str(await session.get_property(unit, "LoadState"))
        load_error = await session.get_property(unit, "LoadError")  # (name, message); empty when it loaded
    except BusLostError as error:
        raise StartCheckError(f"lost the {actuator.bus} bus talking to systemd ({error})", bus=True) from None
    except DbusCallError as error:
        raise _refusal(actuator, error) from None
    finally:
        await session.close()
    problem = _load_problem(actuator, load_state, load_error)
    if problem is not None:
        raise StartCheckError(problem, bus=False)


async def check_flags_wiring(
    actuator: SystemdActuator, flags_file: Path, *, timeout_s: float = CHECK_TIMEOUT_S
) -> None:
    """With --remediate: the unit reads the flags file (`EnvironmentFile=`) and puts its variable on vLLM's
    command line (`ExecStart=... $VLLM_SIDECAR_FLAGS`); else StartCheckError naming what to add. A unit that did
    not would start with the flags that failed, and a change would be reverted only at the start timeout."""
    try:
        async with asyncio.timeout(timeout_s):
            session = await DbusSession.open(actuator.address)
            try:
                (path,) = await session.call(MANAGER, "LoadUnit", "s", actuator.unit)
                service = Target(bus_name=SYSTEMD_BUS_NAME, path=str(path), interface=SERVICE_INTERFACE)
                files = await session.get_property(service, "EnvironmentFiles")  # a(sb): path, "-" given
                commands = await session.get_property(service, "ExecStart")  # a(sasbttttuii): path, argv, ...
            finally:
                await session.close()
    except (TimeoutError, BusUnavailableError, BusLostError, DbusCallError) as error:
        raise StartCheckError(
            f"cannot read how {actuator.unit} starts vLLM ({error or 'no answer'}), so whether it reads "
            f"{flags_file} is unknown",
            bus=True,
        ) from None
    read = (
        {str(entry[0]) for entry in files if isinstance(entry, tuple | list) and entry}
        if isinstance(files, list)
        else set()
    )
    argv = (
        [
            str(word)
            for command in commands
            if isinstance(command, tuple | list) and len(command) > 1
            for word in command[1]
        ]
        if isinstance(commands, list)
        else []
    )
    missing = []
    if str(flags_file) not in read:
        missing.append(f"EnvironmentFile=-{flags_file}")
    if f"${FLAGS_VARIABLE}" not in argv:  # unbraced: split into words; ${...} would be one argument
        missing.append(f"${FLAGS_VARIABLE} (unbraced) at the end of ExecStart=")
    if missing:
        raise StartCheckError(
            f"{actuator.unit} does not start vLLM with the flags the sidecar sets: add {' and '.join(missing)} "
            "(deploy/systemd/vllm.service.example; docs/remediation.md)",
            bus=False,
        )


def _unreachable(actuator: SystemdActuator, error: BusUnavailableError) -> str:
    if actuator.bus == "system":
        where = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS_DEFAULT
        return (
            f"cannot reach the system bus at {where} ({error}): run the sidecar on vLLM's host beside systemd (in "
            "a container, mount /run/dbus/system_bus_socket), or --systemd-bus user for a user manager's unit"
        )
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    where = f" at {address}" if address else ""  # else the error says the variable is not set
    return (
        f"cannot reach the user bus{where} ({error}): run the sidecar as the user whose manager runs vLLM, with "
        "that user's DBUS_SESSION_BUS_ADDRESS, or --systemd-bus system for a system unit"
    )


def _refusal(actuator: SystemdActuator, error: DbusCallError) -> StartCheckError:
    if error.name in _NO_MANAGER_ERRORS:
        return StartCheckError(
            f"no systemd manager answers on the {actuator.bus} bus ({error.name}): run the sidecar where systemd "
            "runs vLLM" + (", or --systemd-bus user for a user manager" if actuator.bus == "system" else ""),
            bus=True,
        )
    if error.name == f"{SYSTEMD_BUS_NAME}.NoSuchUnit":
        return StartCheckError(_not_found(actuator, error.message), bus=False)
    return StartCheckError(
        f"systemd on the {actuator.bus} bus refused to load {actuator.unit} ({error.name}: {error.message})",
        bus=False,
    )


def _load_problem(actuator: SystemdActuator, load_state: str, load_error: object) -> str | None:
    """What stops systemd from starting the unit, from its LoadState (`systemctl show -p LoadState`)."""
    if load_state == "loaded":
        return None
    if load_state == "not-found":
        return _not_found(actuator, "LoadState not-found")
    systemctl = "systemctl --user" if actuator.bus == "user" else "systemctl"
    if load_state == "masked":
        return f"{actuator.unit} is masked: systemd will not start it; `{systemctl} unmask {actuator.unit}`"
    said = ""
    if isinstance(load_error, tuple) and len(load_error) == 2 and load_error[1]:  # (name, message)
        said = f": {load_error[1]}"
    return (
        f"systemd cannot load {actuator.unit} (LoadState {load_state}{said}): fix its unit file and run "
        f"`{systemctl} daemon-reload`; `{systemctl} status {actuator.unit}` names the line"
    )


def _not_found(actuator: SystemdActuator, why: str) -> str:
    systemctl = "systemctl --user" if actuator.bus == "user" else "systemctl"
    return (
        f"systemd on the {actuator.bus} bus knows no unit {actuator.unit} ({why}): install its unit file and run "
        f"`{systemctl} daemon-reload`, or name the unit that runs vLLM"
    )
