"""The sidecar itself killed with `kill -9` in the middle of a drain, and in the middle of a restart, then
started again on the same --state-dir.

The simulator's `hang` scenario under load gives an engine that stops with requests running (a completion sent
to it is never answered, so the engine probe proves the wedge); the exec adapter restarts it through
`restart_sim.py`, whose witness file counts every restart that really happened, whatever the sidecar believes.
The budget is one restart an hour: the ledger must hold it across sidecar restarts (no restart beyond it), the
state must come back sane, and admission must not stay paused. A hung engine is restarted without a drain, so
the drain that is killed is a manual restart's, by a first sidecar that would not restart the hang itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess

from .chaos import (
    Load,
    SimUnderExec,
    assert_clean_log,
    assert_survived,
    named,
    policy,
    read_events,
    scrape,
    value,
    wait_until,
)

HUNG_AFTER_S = 2.0
PROBE_TIMEOUT_S = 1.0  # the simulator's hang never answers the probe: proven in 1 s
TOKEN = "chaos-admin-token-0123456789"  # noqa: S105 - a test fixture, not a secret


@pytest.fixture
def sim_folder(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "sim"
    yield folder
    try:
        pid = int((folder / "sim.pid").read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # the last simulator the restart command started (its pid file)


def _sidecar(
    sim: SimUnderExec, state: Path, log: Path, *, drain_timeout_s: float, args: tuple[str, ...] = ()
) -> SidecarProcess:
    sidecar = SidecarProcess(
        [
            *("--vllm-url", sim.url, "--gpu-source", "sim", "--interval", "0.5", "--state-dir", str(state)),
            *("--actuator", "exec", "--exec-command", sim.command, "--max-restarts-per-hour", "1"),
            *("--hung-after", f"{HUNG_AFTER_S:g}", "--drain-timeout", f"{drain_timeout_s:g}"),
            *("--probe-timeout", f"{PROBE_TIMEOUT_S:g}", "--startup-timeout", "30"),
            *args,
        ],
        log,
    )
    sidecar.wait_ready()
    return sidecar


def _ledger(state: Path) -> list[dict[str, object]]:
    path = state / "restart-ledger.json"
    if not path.exists():
        return []
    document = json.loads(path.read_text())  # must always parse: writes are atomic
    restarts = document["restarts"]
    assert isinstance(restarts, list)
    return restarts


def _state(sidecar: SidecarProcess) -> str:
    return str(policy(sidecar)["state"])


def test_killed_mid_drain_the_new_sidecar_restarts_once_and_the_ledger_then_holds_the_budget(
    tmp_path: Path, sim_folder: Path
) -> None:
    sim = SimUnderExec(sim_folder, "hang", "--hang-after-s", "1", "--decode-step-s", "0.05")
    state = tmp_path / "state"
    load = Load(sim.url).start()
    first = second = third = None
    try:
        # 1. Hung under load: the first sidecar (which would not restart a hang for 10 minutes, nor end a drain
        # for a stall) drains for a manual restart; the drain cannot finish: the engine is stopped ...
        token = tmp_path / "admin-token"
        token.write_text(TOKEN)
        patient = ("--hung-after", "600", "--stall-pause-after", "300", "--admin-token-file", str(token))
        first = _sidecar(sim, state, tmp_path / "first.log", drain_timeout_s=60, args=patient)
        asked = httpx.post(first.url + "/admin/restart", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert asked.status_code == 200, asked.text
        wait_until(lambda: _state(first) == "draining", 30, "the first sidecar to drain", sim.log_tail)
        assert first.get("/readyz").status_code == 503
        first.process.kill()  # ... and is killed with SIGKILL in the middle of it
        first.process.wait(timeout=10)
        killed_at = time.monotonic()
        assert sim.restarts() == [], "nothing was restarted yet"
        assert _ledger(state) == []
        assert_clean_log(first.log_path)

        # 2. A new sidecar on the same state: a fresh view, the engine still hung, one restart within budget.
        second = _sidecar(sim, state, tmp_path / "second.log", drain_timeout_s=3)
        assert second.get("/readyz").status_code == 200  # admission is not left paused by the dead sidecar
        wait_until(lambda: len(sim.restarts()) == 1, 40, "the second sidecar to restart the hung simulator")
        restarted_s = time.monotonic() - killed_at
        wait_until(lambda: bool(named(read_events(second.log_path), "restart_outcome")), 10, "the restart's outcome")
        # The new simulator hangs too under the same load: the budget (1 an hour) now refuses a second restart.
        wait_until(
            lambda: "restart budget exhausted" in str(policy(second).get("would_restart_but")),
            40,
            "the budget to block the next restart",
        )
        assert [r["reason"] for r in _ledger(state)] == ["engine_hung"]
        second_metrics = scrape(second)
        assert value(second_metrics, "vllm_sidecar_restart_budget_remaining") == 0.0
        assert value(second_metrics, "vllm_sidecar_restarts_total", reason="engine_hung") == 1.0
        assert_survived(second)
        second_events = read_events(second.log_path)
        second.process.kill()
        second.process.wait(timeout=10)

        # 3. Killed again and started again: the ledger holds the budget; no second restart, admitting.
        third = _sidecar(sim, state, tmp_path / "third.log", drain_timeout_s=3)
        wait_until(
            lambda: "restart budget exhausted" in str(policy(third).get("would_restart_but")),
            30,
            "the third sidecar to see the budget spent",
        )
        time.sleep(HUNG_AFTER_S)  # the engine is seen hung the whole time: a restart, if allowed, would begin
        third_policy = policy(third)
        third_readyz = third.get("/readyz").status_code
        third_metrics = scrape(third)
        assert_survived(third)
    finally:
        load.stop()
        for sidecar in (first, second, third):
            if sidecar is not None:
                sidecar.kill()
        sim.stop()

    assert len(sim.restarts()) == 1, f"restarts beyond the budget of 1: {sim.restarts()}"
    assert [r["reason"] for r in _ledger(state)] == ["engine_hung"]
    notified = [event["kind"] for event in named(second_events, "notification")]
    assert notified[:2] == ["pause", "restart_begin"], notified
    assert "restart_end" in notified, notified
    assert "budget_exhausted" in notified, notified
    # The engine is wedged and the budget refuses its restart: out of rotation on this sidecar's own proof (its
    # probe got no answer), not held by anything the killed ones left behind.
    assert third_policy["state"] == "paused", third_policy
    assert str(third_policy["readiness"]).startswith("paused: a 1-token probe completion got no answer"), third_policy
    assert third_policy["restarts_in_budget_window"] == 1, third_policy
    assert third_readyz == 503
    assert value(third_metrics, "vllm_sidecar_restart_budget_remaining") == 0.0
    third_events = read_events(third.log_path)
    assert named(third_events, "restart_ledger_unreadable") == []
    assert [e for e in named(third_events, "action") if e["action"] in ("drain", "restart")] == []
    print(f"\nkilled mid-drain: the next sidecar restarted the hung engine {restarted_s:.1f} s after the kill")


def test_killed_while_the_adapter_restarts_the_restart_still_counts_against_the_budget(
    tmp_path: Path, sim_folder: Path
) -> None:
    # The restart command takes 3 s (a platform stopping a vLLM with hung connections): the sidecar that asked
    # for it is killed meanwhile, and the command finishes anyway, in its own session.
    sim = SimUnderExec(sim_folder, "hang", "--hang-after-s", "1", "--decode-step-s", "0.05", delay_s=3.0)
    state = tmp_path / "state"
    load = Load(sim.url).start()
    first = second = None
    try:
        first = _sidecar(sim, state, tmp_path / "first.log", drain_timeout_s=1)
        # The command's own witness, not the state: the state reads "restarting" while the incident is taken
        # (up to --incident-timeout) before the adapter is called.
        wait_until(lambda: len(sim.restarts_begun()) == 1, 30, "the first sidecar to call the adapter", sim.log_tail)
        first.process.kill()
        first.process.wait(timeout=10)
        assert_clean_log(first.log_path)
        wait_until(lambda: len(sim.restarts()) == 1, 20, "the restart command to finish without its sidecar")

        second = _sidecar(sim, state, tmp_path / "second.log", drain_timeout_s=1)
        wait_until(
            lambda: "restart budget exhausted" in str(policy(second).get("would_restart_but")),
            30,
            "the second sidecar to count the restart the first one was killed in",
            lambda: f"\nrestarts: {sim.restarts()}; policy: {policy(second)}",
        )
        time.sleep(HUNG_AFTER_S)
        second_policy = policy(second)
        second_readyz = second.get("/readyz").status_code
        assert_survived(second)
    finally:
        load.stop()
        for sidecar in (first, second):
            if sidecar is not None:
                sidecar.kill()
        sim.stop()

    assert len(sim.restarts()) == 1, f"restarts beyond the budget of 1: {sim.restarts()}"
    ledger = _ledger(state)
    assert [r["reason"] for r in ledger] == ["engine_hung"], ledger
    assert "sidecar stopped" in str(ledger[0]["detail"]), ledger
    assert second_policy["restarts_in_budget_window"] == 1, second_policy
    # Out of rotation on its own proof of the wedge (the budget refuses the restart), nothing left by the first.
    assert str(second_policy["readiness"]).startswith("paused: a 1-token probe completion got no answer"), second_policy
    assert second_readyz == 503
    recovered = named(read_events(second.log_path), "restart_in_flight_at_stop")
    assert len(recovered) == 1, recovered
