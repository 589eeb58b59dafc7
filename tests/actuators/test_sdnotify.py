"""sd_notify: readiness, status and watchdog pings, to a test-bound socket and to a real systemd."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.actuators.systemd import SystemdActuator
from sidecar.shell.sdnotify import Notifier, run_watchdog, watchdog_interval_s

from .units import notify_unit, wait_until
from .user_systemd import UserSystemd


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A notify socket bound at a path, as systemd's would be; yields it and its NOTIFY_SOCKET value."""
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(2.0)
        yield sock, path


def drain(sock: socket.socket) -> list[bytes]:
    messages: list[bytes] = []
    sock.setblocking(False)
    try:
        while True:
            messages.append(sock.recv(4096))
    except BlockingIOError:
        return messages
    finally:
        sock.settimeout(2.0)


def test_ready_with_status_and_the_other_messages_arrive(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})

    assert notifier.enabled
    assert notifier.ready(status="serving on :9468") is None
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving on :9468"
    assert notifier.watchdog() is None
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping() is None
    assert sock.recv(4096) == b"STOPPING=1"


def test_a_status_stays_one_line_so_it_cannot_add_assignments(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver

    Notifier(path).status("vLLM down\nMAINPID=1\nREADY=1")

    assert sock.recv(4096) == b"STATUS=vLLM down MAINPID=1 READY=1"


def test_an_abstract_socket() -> None:
    name = f"vllm-sidecar-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2.0)

        assert Notifier.from_environment({"NOTIFY_SOCKET": "@" + name}).ready() is None
        assert sock.recv(4096) == b"READY=1"


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier.from_environment({})

    assert not notifier.enabled
    assert (notifier.ready("x"), notifier.watchdog(), notifier.stopping()) == (None, None, None)


@pytest.mark.parametrize(
    ("socket_name", "error"),
    [
        ("/nonexistent/notify", "sd_notify to /nonexistent/notify: No such file or directory"),
        ("relative/notify", "NOTIFY_SOCKET='relative/notify' is neither an absolute path nor an @abstract name"),
        ("vsock:2:1234", "NOTIFY_SOCKET='vsock:2:1234' is neither an absolute path nor an @abstract name"),
    ],
)
def test_a_send_that_cannot_be_made_returns_why_instead_of_raising(socket_name: str, error: str) -> None:
    assert Notifier(socket_name).ready() == error


@pytest.mark.parametrize(
    ("environ", "interval_s"),
    [
        ({"WATCHDOG_USEC": "2000000"}, 1.0),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "4242"}, 0.1),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "4243"}, None),  # another process's watchdog
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "me"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_and_only_for_this_process(
    environ: dict[str, str], interval_s: float | None
) -> None:
    assert watchdog_interval_s(environ, pid=4242) == interval_s


def test_watchdog_pid_defaults_to_our_own_pid() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}) == 0.1


@pytest.mark.looptime
async def test_pings_stop_while_the_loop_is_stalled_and_resume_after(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    alive = True
    task = asyncio.create_task(run_watchdog(Notifier(path), interval_s=1.0, is_alive=lambda: alive))
    try:
        await asyncio.sleep(10.5)  # virtual time: pings at 0, 1, ..., 10 s
        pings = drain(sock)
        assert pings == [b"WATCHDOG=1"] * 11

        alive = False
        await asyncio.sleep(10.0)
        assert drain(sock) == []

        alive = True
        await asyncio.sleep(3.0)  # pings at 21, 22 and 23 s
        assert drain(sock) == [b"WATCHDOG=1"] * 3
    finally:
        task.cancel()


async def test_no_pings_for_another_process_watchdog(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    interval_s = watchdog_interval_s({"WATCHDOG_USEC": "40000", "WATCHDOG_PID": str(os.getpid() + 1)})

    await asyncio.wait_for(run_watchdog(Notifier(path), interval_s=interval_s, is_alive=lambda: True), 1.0)

    assert drain(sock) == []


@pytest.mark.looptime
async def test_send_errors_go_to_on_error_and_the_pings_go_on(tmp_path: Path) -> None:
    errors: list[str] = []
    task = asyncio.create_task(
        run_watchdog(Notifier(str(tmp_path / "gone")), interval_s=1.0, is_alive=lambda: True, on_error=errors.append)
    )
    await asyncio.sleep(4.5)  # virtual time: sends at 0, 1, 2, 3 and 4 s
    task.cancel()

    assert len(errors) == 5
    assert errors[0].endswith("No such file or directory")


# -- against a real systemd ---------------------------------------------------------------------------------------

WATCHDOG_S = 2.0


async def states_while(job: asyncio.Task[ActuatorOutcome], service: SystemdActuator) -> list[tuple[float, str]]:
    """Read the unit's ActiveState until `job` ends: (monotonic time the answer was in, state)."""
    seen: list[tuple[float, str]] = []
    while not job.done():
        state = await service.read_state()
        seen.append((time.monotonic(), state.active_state))
        await asyncio.sleep(0.05)
    return seen


def logged_time(log: str, event: str) -> float:
    """When notify_service.py logged `event` (READY, STALL), on the monotonic clock all processes share."""
    (first, *_) = [line for line in log.splitlines() if line.startswith(f"{event} at monotonic ")]
    return float(first.rsplit(" ", 1)[1])


async def test_a_notify_unit_is_active_only_after_ready_and_pings_keep_it_alive(user_systemd: UserSystemd) -> None:
    unit = "notify-ready.service"
    log = user_systemd.root / "notify-ready.log"
    user_systemd.write_unit(unit, notify_unit(ready_after_s=1.0, alive_for_s=600, watchdog_s=WATCHDOG_S, log=log))
    service = SystemdActuator(unit, bus="user", bus_address=user_systemd.bus_address, job_timeout_s=30)

    job: asyncio.Task[ActuatorOutcome] = asyncio.create_task(service.restart(reason="start", dry_run=False))
    during = await states_while(job, service)
    outcome = job.result()

    assert outcome.status is OutcomeStatus.DONE, (outcome, log.read_text())
    assert outcome.duration_s >= 1.0  # the job ends with READY=1, not at exec
    before_ready = [state for answered_at, state in during if answered_at < logged_time(log.read_text(), "READY")]
    assert "activating" in before_ready  # exec'd, waiting for READY=1 (the first reads may precede the job)
    assert "active" not in before_ready, before_ready
    ready = await service.read_state()
    assert ready.active_state == "active"

    await asyncio.sleep(WATCHDOG_S * 1.5)  # longer than WatchdogSec: only the pings keep it from being killed
    later = await service.read_state()
    assert (later.active_state, later.main_pid, later.n_restarts) == ("active", ready.main_pid, 0), log.read_text()
    user_systemd.call("StopUnit", "ss", unit, "replace")


async def test_systemd_restarts_a_unit_whose_pings_stop(user_systemd: UserSystemd) -> None:
    unit = "notify-stall.service"
    log = user_systemd.root / "notify-stall.log"
    alive_for_s = 1.5
    user_systemd.write_unit(unit, notify_unit(ready_after_s=0, alive_for_s=alive_for_s, watchdog_s=WATCHDOG_S, log=log))
    service = SystemdActuator(unit, bus="user", bus_address=user_systemd.bus_address, job_timeout_s=30)
    started = await service.restart(reason="start", dry_run=False)
    assert started.status is OutcomeStatus.DONE, (started.detail, log.read_text())
    first = await service.read_state()

    async def restarted_by_watchdog() -> bool:
        return (await service.read_state()).n_restarts >= 1

    # Restart=on-watchdog: systemd restarts the unit only when its watchdog fired
    await wait_until(restarted_by_watchdog, timeout_s=alive_for_s + WATCHDOG_S + 5, what="a watchdog restart")
    # When the watchdog fired, by systemd's own record (the unit left `active`), not by when this test looked:
    # the last ping is at most one interval (WatchdogSec/2) before the stall, and systemd kills WatchdogSec after
    # it (its timer's accuracy is 250 ms).
    killed_at_s = int(str(user_systemd.unit_property(unit, "ActiveExitTimestampMonotonic"))) / 1e6
    restart_after_stall_s = killed_at_s - logged_time(log.read_text(), "STALL")
    assert WATCHDOG_S / 2 <= restart_after_stall_s <= WATCHDOG_S + 1.0, restart_after_stall_s
    second = await service.read_state()
    assert second.main_pid != first.main_pid
    assert "ready; watchdog ping every 1.0 s" in log.read_text()
    print(f"watchdog fired {restart_after_stall_s:.2f} s after the pings stopped (WatchdogSec={WATCHDOG_S:g})")
    user_systemd.call("StopUnit", "ss", unit, "replace")
