"""The systemd actuator against a real systemd (a user manager, see user_systemd.py): RestartUnit over D-Bus."""

from __future__ import annotations

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.systemd import SystemdActuator
from tests.loopback import closed_port

from .units import process_exists, service, sim_healthy, sim_unit, wait_until
from .user_systemd import UserSystemd

SIM_START_TIMEOUT_S = 20.0


def actuator(manager: UserSystemd, unit: str, *, job_timeout_s: float = 30.0) -> SystemdActuator:
    return SystemdActuator(unit, bus="user", bus_address=manager.bus_address, job_timeout_s=job_timeout_s)


async def test_restart_is_done_with_a_new_main_pid_and_the_sim_answers_again(user_systemd: UserSystemd) -> None:
    port = closed_port()
    user_systemd.write_unit("fakevllm.service", sim_unit(port))
    fakevllm = actuator(user_systemd, "fakevllm.service")
    started = await fakevllm.restart(reason="test set-up", dry_run=False)  # RestartUnit starts a stopped unit
    assert started.status is OutcomeStatus.DONE, started.detail
    await wait_until(lambda: sim_healthy(port), timeout_s=SIM_START_TIMEOUT_S, what="the sim answering /health")
    before = await fakevllm.read_state()
    assert before.active_state == "active"
    assert before.main_pid is not None

    outcome = await fakevllm.restart(reason="KV cache pressure", dry_run=False)

    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert outcome.detail.startswith("restarted fakevllm.service on the user bus (/org/freedesktop/systemd1/job/")
    after = await fakevllm.read_state()
    assert after.active_state == "active"
    assert after.main_pid not in (None, before.main_pid)
    assert not process_exists(before.main_pid)  # the old process is gone, not left beside the new
    back_s = await wait_until(lambda: sim_healthy(port), timeout_s=SIM_START_TIMEOUT_S, what="the sim after restart")
    print(f"restart round trip {outcome.duration_s * 1000:.0f} ms; /health again {back_s:.2f} s later")


async def test_dry_run_does_nothing(user_systemd: UserSystemd) -> None:
    user_systemd.write_unit("sleeper.service", service("Type=exec", "ExecStart=/bin/sleep 1000", description="x"))
    sleeper = actuator(user_systemd, "sleeper.service")
    assert (await sleeper.restart(reason="set-up", dry_run=False)).status is OutcomeStatus.DONE
    before = await sleeper.read_state()

    outcome = await sleeper.restart(reason="would restart", dry_run=True)

    assert outcome.status is OutcomeStatus.DRY_RUN
    assert outcome.detail == "would call RestartUnit(sleeper.service, replace) on the user bus"
    after = await sleeper.read_state()
    assert (after.active_state, after.main_pid, after.n_restarts) == ("active", before.main_pid, before.n_restarts)


async def test_an_unknown_unit_fails_with_no_such_unit(user_systemd: UserSystemd) -> None:
    outcome = await actuator(user_systemd, "not-installed.service").restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail.startswith("no such unit: not-installed.service on the user manager"), outcome.detail
    assert "\n" not in outcome.detail


async def test_a_start_that_fails_fails_with_the_job_result(user_systemd: UserSystemd) -> None:
    user_systemd.write_unit("broken.service", service("Type=oneshot", "ExecStart=/bin/false", description="x"))
    broken = actuator(user_systemd, "broken.service")

    outcome = await broken.restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert "job result: failed" in outcome.detail
    assert "systemctl --user status broken.service" in outcome.detail
    assert (await broken.read_state()).active_state == "failed"


async def test_a_job_that_outlasts_the_bound_fails_promptly_and_is_left_to_systemd(user_systemd: UserSystemd) -> None:
    user_systemd.write_unit(
        "slowstart.service",
        service("Type=exec", "ExecStartPre=/bin/sleep 30", "ExecStart=/bin/sleep 1000", description="x"),
    )
    slow = actuator(user_systemd, "slowstart.service", job_timeout_s=1.0)

    outcome = await slow.restart(reason="x", dry_run=False)

    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail.startswith("timed out after 1 s: restart job /org/freedesktop/systemd1/job/"), outcome.detail
    assert 1.0 <= outcome.duration_s < 1.5
    state = await slow.read_state()
    assert (state.active_state, state.sub_state) == ("activating", "start-pre")
    user_systemd.call("StopUnit", "ss", "slowstart.service", "replace")


async def test_reading_a_unit_that_does_not_exist(user_systemd: UserSystemd) -> None:
    state = await actuator(user_systemd, "ghost.service").read_state()

    assert (state.load_state, state.active_state, state.main_pid, state.n_restarts) == (
        "not-found",
        "inactive",
        None,
        0,
    )
