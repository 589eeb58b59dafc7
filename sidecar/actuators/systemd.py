"""Restart vLLM's systemd service over D-Bus, and read the service's state. I/O (D-Bus, through jeepney).

A restart is `org.freedesktop.systemd1.Manager.RestartUnit(unit, "replace")`, what `systemctl restart` sends,
preceded for a hard restart (a dead or hung engine) by `KillUnit(unit, "all", SIGKILL)`: a SIGSTOPped or
wedged engine cannot answer the stop's SIGTERM, and would hold the restart for the unit's whole
`TimeoutStopSec` (45 s in deploy/systemd/vllm.service.example); killing every process of the unit also leaves
none of the old vLLM beside the new one (an EngineCore can outlive its API server). A KillUnit that polkit
refuses (a rule without the "kill" verb) is said in the outcome and the restart goes on as a plain one.

The restart is followed by waiting for the `JobRemoved` signal of the job it queued: only that signal says
whether the restart worked (`done`) or not (`failed`, `timeout`, `dependency`, `canceled`, `skipped`...). The
match for the signal is in place before the call, so a job that ends before the call's answer arrives is not
missed. Each call opens its own connection (restarts are rare; nothing is held between them), everything is
bounded by `job_timeout_s`, and every failure comes back as a FAILED outcome with one line saying why, never as
an exception. A job still running at the bound is left to systemd (its own `TimeoutStartSec` ends it);
cancelling it could leave vLLM stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.actuators.dbus import BusLostError, BusUnavailableError, DbusCallError, DbusSession, Target
from sidecar.actuators.unit_name import validate_unit_name
from sidecar.model.supervision import Restarter, Supervision

BusKind = Literal["system", "user"]
SYSTEMD_BUS_NAME = "org.freedesktop.systemd1"
MANAGER = Target(bus_name=SYSTEMD_BUS_NAME, path="/org/freedesktop/systemd1", interface=f"{SYSTEMD_BUS_NAME}.Manager")
UNIT_INTERFACE = f"{SYSTEMD_BUS_NAME}.Unit"
SERVICE_INTERFACE = f"{SYSTEMD_BUS_NAME}.Service"
JOB_MODE = "replace"  # what `systemctl restart` uses: a pending stop or start of the unit is replaced
JOB_REMOVED_MATCH = (
    f"type='signal',sender='{SYSTEMD_BUS_NAME}',path='{MANAGER.path}',interface='{MANAGER.interface}',"
    "member='JobRemoved'"
)
JOB_DONE = "done"

_ACCESS_ERRORS = frozenset(
    {"org.freedesktop.DBus.Error.AccessDenied", "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"}
)
_NO_MANAGER_ERRORS = frozenset(
    {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
)


class SystemdError(Exception):
    """Reading the unit's state failed; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitState:
    """What systemd says about the unit now (`systemctl show -p ...`)."""

    unit: str
    load_state: str  # loaded, not-found, masked, error...
    active_state: str  # active, activating, deactivating, inactive, failed, reloading
    sub_state: str  # running, start-pre, exited, dead, auto-restart...
    main_pid: int | None  # None while the service has no main process (systemd says 0)
    n_restarts: int  # restarts systemd itself made (Restart=), not those asked for over D-Bus
    result: str = ""  # the service's last result: success, exit-code, signal, timeout, start-limit-hit...
    job_pending: bool = False  # a start, stop or restart job is queued for the unit
    # When the unit last left `active`, and when its main process last exited (monotonic µs; 0: not since the
    # unit was loaded). A stop job leaves `active` first and the process exits after (its SIGTERM); a process
    # that exits on its own, or is killed from outside, exits first.
    active_exit_us: int = 0
    main_exit_us: int = 0
    # When the unit last entered `active`, and when it last left `inactive` (its last start began).
    active_enter_us: int = 0
    inactive_exit_us: int = 0

    @property
    def started_and_never_active(self) -> bool:
        """Its last start (it left `inactive` after it last entered `active`) never reached `active`: the
        timestamps of an earlier run (a stop job's, say) say nothing of how this one ended."""
        return self.inactive_exit_us > 0 and self.active_enter_us < self.inactive_exit_us

    @property
    def stopped_by_job(self) -> bool:
        """Stopped on purpose (`systemctl stop`, a dependency stopping it), not by vLLM exiting or being killed:
        it left `active` before its main process exited, in its last run."""
        return not self.started_and_never_active and 0 < self.active_exit_us < self.main_exit_us

    @property
    def ended_before_active(self) -> bool:
        """Its last start ended by a signal (or cleanly) before the unit was ever `active`: a stop job during
        ExecStartPre (the shipped unit's wait-gpu) or before the exec, and a kill from outside then, leave the
        same state, and no `active` exit was recorded to order against the process's. (A start that failed on
        its own ends with exit-code, timeout and the like.)"""
        return self.started_and_never_active and self.result in ("signal", "success")


@dataclass(slots=True)
class _Progress:
    """How far a restart got, for the message when the bound cuts it short."""

    step: str = "connecting"
    job: str | None = None


class SystemdActuator:
    """Restarts one systemd service, on the system manager or a user manager."""

    name: str = "systemd"

    def __init__(
        self,
        unit: str,
        *,
        bus: BusKind = "system",
        job_timeout_s: float = 900.0,
        bus_address: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.unit = validate_unit_name(unit)
        if bus not in ("system", "user"):
            raise ValueError(f"systemd bus must be 'system' or 'user', not {bus!r}")
        if not (math.isfinite(job_timeout_s) and job_timeout_s > 0):
            raise ValueError(f"systemd job timeout must be a positive number of seconds, not {job_timeout_s!r}")
        self.bus: BusKind = bus
        self.job_timeout_s = job_timeout_s
        # jeepney reads DBUS_SYSTEM_BUS_ADDRESS / DBUS_SESSION_BUS_ADDRESS for "SYSTEM" / "SESSION"
        self._address = bus_address or ("SYSTEM" if bus == "system" else "SESSION")
        self._clock = clock

    @property
    def address(self) -> str:
        """The bus as jeepney takes it: "SYSTEM", "SESSION" or a D-Bus address."""
        return self._address

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        """Restart the unit and wait for systemd's verdict. `reason` is the caller's to log: D-Bus takes none."""
        started = self._clock()
        if dry_run:
            kill = f"KillUnit({self.unit}, all, SIGKILL), then " if hard else ""
            detail = f"would call {kill}RestartUnit({self.unit}, {JOB_MODE}) on the {self.bus} bus"
            return ActuatorOutcome(status=OutcomeStatus.DRY_RUN, detail=detail, duration_s=self._clock() - started)
        progress = _Progress()
        try:
            async with asyncio.timeout(self.job_timeout_s):
                status, detail = await self._restart(progress, hard=hard)
        except TimeoutError:
            status, detail = OutcomeStatus.FAILED, self._timeout_detail(progress)
        except Exception as error:  # noqa: BLE001 - an actuator never raises into the loop: the outcome says it
            status, detail = OutcomeStatus.FAILED, f"restart of {self.unit}: {type(error).__name__}: {error}"
        return ActuatorOutcome(status=status, detail=detail, duration_s=self._clock() - started)

    async def close(self) -> None:
        """Nothing to release: each call opens and closes its own connection."""

    async def read_state(self) -> UnitState:
        """The unit's load, active and sub state, main PID and NRestarts. Raises SystemdError, bounded by 10 s."""
        try:
            async with asyncio.timeout(min(self.job_timeout_s, 10.0)):
                session = await DbusSession.open(self._address)
                try:
                    (path,) = await session.call(MANAGER, "LoadUnit", "s", self.unit)
                    unit = Target(bus_name=SYSTEMD_BUS_NAME, path=str(path), interface=UNIT_INTERFACE)
                    service = Target(bus_name=SYSTEMD_BUS_NAME, path=str(path), interface=SERVICE_INTERFACE)
                    load_state = await session.get_property(unit, "LoadState")
                    active_state = await session.get_property(unit, "ActiveState")
                    sub_state = await session.get_property(unit, "SubState")
                    main_pid = await session.get_property(service, "MainPID")
                    n_restarts = await session.get_property(service, "NRestarts")
                    result = await session.get_property(service, "Result")
                    job = await session.get_property(unit, "Job")  # (id, path); id 0 when no job is queued
                    active_exit = await session.get_property(unit, "ActiveExitTimestampMonotonic")
                    main_exit = await session.get_property(service, "ExecMainExitTimestampMonotonic")
                    active_enter = await session.get_property(unit, "ActiveEnterTimestampMonotonic")
                    inactive_exit = await session.get_property(unit, "InactiveExitTimestampMonotonic")
                finally:
                    await session.close()
        except TimeoutError as error:
            raise SystemdError(f"no answer from systemd on the {self.bus} bus about {self.unit}") from error
        except (BusUnavailableError, BusLostError, DbusCallError) as error:
            raise SystemdError(self._error_detail(error)) from error
        return UnitState(
            unit=self.unit,
            load_state=str(load_state),
            active_state=str(active_state),
            sub_state=str(sub_state),
            main_pid=main_pid if isinstance(main_pid, int) and main_pid > 0 else None,
            n_restarts=n_restarts if isinstance(n_restarts, int) else 0,
            result=str(result),
            job_pending=isinstance(job, tuple) and bool(job) and job[0] != 0,
            active_exit_us=active_exit if isinstance(active_exit, int) else 0,
            main_exit_us=main_exit if isinstance(main_exit, int) else 0,
            active_enter_us=active_enter if isinstance(active_enter, int) else 0,
            inactive_exit_us=inactive_exit if isinstance(inactive_exit, int) else 0,
        )

    async def supervision(self) -> Supervision:
        """Whether systemd is bringing vLLM back: an auto-restart or a queued job says so; a unit stopped with no
        job queued will stay stopped (vLLM exited 0 after its engine died, under Restart=on-failure; or the start
        limit was hit), and then the sidecar is the one to start it, unless a stop job stopped it (OPERATOR).

        Told apart by systemd's own timestamps, which it keeps while the unit stays loaded (an enabled or wanted
        unit does): a unit that systemd unloaded once it stopped (neither enabled nor wanted by anything) has
        none, and is read as vLLM having exited."""
        try:
            state = await self.read_state()
        except SystemdError as error:
            return Supervision(restarter=Restarter.UNKNOWN, detail=str(error))
        return unit_supervision(state)

    async def _restart(self, progress: _Progress, *, hard: bool) -> tuple[OutcomeStatus, str]:
        try:
            session = await DbusSession.open(self._address)
        except BusUnavailableError as error:
            return OutcomeStatus.FAILED, self._error_detail(error)
        killed = ""
        try:
            if hard:
                progress.step = "killing the unit's processes"
                killed = await self._kill_all(session)
            progress.step = "subscribing to JobRemoved"
            await session.add_match(JOB_REMOVED_MATCH)
            # systemd sends JobRemoved to the client that queued the job even unsubscribed; Subscribe is for safety
            with contextlib.suppress(DbusCallError):
                await session.call(MANAGER, "Subscribe")
            progress.step = "calling RestartUnit"
            (job,) = await session.call(MANAGER, "RestartUnit", "ss", self.unit, JOB_MODE)
            progress.job, progress.step = str(job), "waiting for the job"
            result = await _job_result(session, progress.job)
        except (BusLostError, DbusCallError) as error:
            return OutcomeStatus.FAILED, self._error_detail(error)
        finally:
            await session.close()
        if result == JOB_DONE:
            return OutcomeStatus.DONE, f"{killed}restarted {self.unit} on the {self.bus} bus ({progress.job})"
        return OutcomeStatus.FAILED, (
            f"restart of {self.unit} ended with job result: {result} ({progress.job}); see `{self._systemctl()} "
            f"status {self.unit}`"
        )

    async def _kill_all(self, session: DbusSession) -> str:
        """SIGKILL every process of the unit; the outcome's opening words. A refusal is said, not fatal."""
        try:
            await session.call(MANAGER, "KillUnit", "ssi", self.unit, "all", int(signal.SIGKILL))
        except DbusCallError as error:
            if error.name in _ACCESS_ERRORS:
                return f'KillUnit refused ({error.name}: add the "kill" verb to the polkit rule), so '
            return ""  # no process left to kill (the unit is stopped): nothing to say
        return "killed (SIGKILL) and "

    def _error_detail(self, error: Exception) -> str:  # noqa: PLR0911 - one return per kind of failure
        bus = f"the {self.bus} bus"
        if isinstance(error, BusUnavailableError):
            return f"cannot reach {bus} ({self._address}): {error}"
        if isinstance(error, BusLostError):
            return f"lost {bus} ({error}) talking to systemd about {self.unit}"
        if isinstance(error, DbusCallError):
            if error.name == f"{SYSTEMD_BUS_NAME}.NoSuchUnit":
                return f"no such unit: {self.unit} on the {self.bus} manager ({error.message})"
            if error.name in _ACCESS_ERRORS:
                hint = (
                    "run as root or grant polkit action org.freedesktop.systemd1.manage-units to the sidecar's user"
                    if self.bus == "system"
                    else "a user manager obeys only its own user (and root)"
                )
                return f"not allowed to restart {self.unit} on {bus} ({error.name}: {error.message}); {hint}"
            if error.name in _NO_MANAGER_ERRORS:
                return f"no systemd manager on {bus} ({error.name}: {error.message})"
            return f"systemd refused for {self.unit}: {error.name}: {error.message}"
        return f"{type(error).__name__}: {error}"

    def _timeout_detail(self, progress: _Progress) -> str:
        limit = f"{self.job_timeout_s:g} s"
        if progress.job is None:
            return f"timed out after {limit} {progress.step} on the {self.bus} bus for {self.unit}"
        return (
            f"timed out after {limit}: restart job {progress.job} of {self.unit} has not finished; "
            "left to systemd (its TimeoutStartSec ends it)"
        )

    def _systemctl(self) -> str:
        return "systemctl --user" if self.bus == "user" else "systemctl"


def unit_supervision(state: UnitState) -> Supervision:
    """Who restarts the unit's vLLM, from its state. Pure."""
    shown = f"unit {state.unit} {state.active_state} ({state.sub_state})"
    result = f", result {state.result}" if state.result else ""
    if state.job_pending:
        return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{shown}{result}, a job is queued")
    if state.sub_state == "auto-restart" or state.active_state in ("activating", "deactivating", "reloading"):
        return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{shown}{result}")
    if state.active_state in ("inactive", "failed") and state.stopped_by_job:
        return Supervision(
            restarter=Restarter.OPERATOR,
            detail=f"{shown}{result}: stopped by a stop job (systemctl stop), not by vLLM exiting",
        )
    if state.active_state in ("inactive", "failed") and state.ended_before_active:
        # Not SIDECAR: starting a unit its operator stopped during wait-gpu would undo the stop within seconds.
        return Supervision(
            restarter=Restarter.UNKNOWN,
            detail=f"{shown}{result}: its start ended before it was active, by a stop job or a kill (systemd's "
            "timestamps do not tell which)",
        )
    if state.active_state in ("inactive", "failed"):
        return Supervision(
            restarter=Restarter.SIDECAR, detail=f"{shown}{result}, no job queued: systemd will not start it"
        )
    # active: a main process runs though nothing listens (loading, or stopping): systemd's to handle.
    return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{shown}{result}, main PID {state.main_pid}")


async def _job_result(session: DbusSession, job: str) -> str:
    """Wait for JobRemoved(id, job, unit, result) of `job` and return its result."""
    while True:
        signal = await session.next_signal()
        if signal.interface != MANAGER.interface or signal.member != "JobRemoved" or len(signal.body) != 4:
            continue
        if signal.body[1] == job:
            return str(signal.body[3])
