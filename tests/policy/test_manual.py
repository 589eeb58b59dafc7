"""Manual overrides from the admin API: pause holds, resume lifts, restart bypasses the budget but is recorded."""

from __future__ import annotations

from sidecar.policy import ManualAction, PolicyState, ProcedureEvent, RestartLedger, RestartReason, RestartRecord
from tests.policy.builders import WALL0, Event, Manual, Replay, Step, engine, obs, ticks

PAUSE, RESUME, DRAIN, RESTART, DONE = "pause_admission", "resume_admission", "drain", "restart", "notify_restart_done"


def test_a_manual_pause_holds_until_a_manual_resume() -> None:
    series: list[Step] = [obs(0), Manual(1, ManualAction.PAUSE)]
    series += [obs(t, engine(usage=0.95 if 10 <= t <= 14 else 0.3)) for t in ticks(2, 60)]
    series += [Manual(61, ManualAction.RESUME), obs(62)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "paused", (PAUSE,)),
        # the KV spike and its all-clear 10 s later change nothing: the manual pause holds
        (61.0, "normal", (RESUME,)),
    ]
    held = replay.at(40)
    assert held.manual_pause
    assert held.pause_reason == "paused by hand; held until a manual resume"
    assert held.reason == "paused by hand; held until a manual resume"
    assert replay.at(62).pause_reason is None


def test_a_manual_resume_lifts_an_automatic_pause_and_the_rules_apply_again() -> None:
    series: list[Step] = [obs(0, engine(usage=0.95)), Manual(1, ManualAction.RESUME), obs(2, engine(usage=0.95))]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "paused", (PAUSE,)),
        (1.0, "normal", (RESUME,)),
        (2.0, "paused", (PAUSE,)),  # still over 0.90: paused again, and the reason says so
    ]
    assert replay.at(1).reason == "admission resumed by hand; the automatic rules apply again from the next tick"


def test_a_manual_restart_bypasses_the_budget_and_is_recorded() -> None:
    full = RestartLedger(
        records=tuple(RestartRecord(wall_time_s=WALL0 - a, reason=RestartReason.ENGINE_HUNG) for a in (900, 600, 30))
    )
    replay = Replay(ledger=full)
    series: list[Step] = [
        obs(0),
        Manual(1, ManualAction.RESTART),
        obs(2, engine(running=0)),
        Event(3, ProcedureEvent.RESTART_ACCEPTED),
        obs(4),
    ]
    assert replay.run(series) == [
        (0.0, "cooldown", ()),  # 30 s after a restart
        (1.0, "draining", (PAUSE, DRAIN)),
        (2.0, "restarting", (RESTART,)),
        (4.0, "cooldown", (RESUME, DONE)),
    ]
    assert [r.reason for r in replay.ledger.records][-1] is RestartReason.MANUAL
    assert replay.at(4).restarts_in_budget_window == 4
    # Recorded like any restart: the series is now 4 long, so the next automatic one waits 480 s.
    assert replay.at(4).cooldown_remaining_s == 480


def test_manual_actions_during_a_restart() -> None:
    replay = Replay()
    replay.run([obs(0), Manual(1, ManualAction.RESTART)])
    refused = replay.step(Manual(2, ManualAction.RESTART))
    assert refused.reason == "manual restart refused: a restart is in progress (draining)"
    assert refused.actions == ()
    assert replay.step(Manual(3, ManualAction.RESUME)).admission_paused
    # A manual pause during the restart outlives it: vLLM comes back, admission stays paused.
    assert replay.step(Manual(4, ManualAction.PAUSE)).actions == ()
    rows = replay.run([obs(6, engine(running=0)), Event(7, ProcedureEvent.RESTART_ACCEPTED), obs(8)])
    assert rows == [(6.0, "restarting", (RESTART,)), (8.0, "paused", (DONE,))]
    assert replay.at(8).pause_reason == "paused by hand; held until a manual resume"


def test_a_manual_restart_during_startup_grace_is_allowed() -> None:
    replay = Replay()
    loading = obs(0, healthy=False, poll_ok=False, age_s=None)
    assert replay.step(loading).state is PolicyState.STARTING
    rows = replay.run([Manual(1, ManualAction.RESTART)])
    assert rows == [(1.0, "draining", (PAUSE, DRAIN))]
