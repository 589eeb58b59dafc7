"""The drain-and-restart procedure: the happy path both ways, and every failure branch ending in a clear state."""

from __future__ import annotations

from sidecar.policy import ActionKind, ManualAction, Observation, PolicyState, ProcedureEvent, RestartReason
from tests.policy.builders import Event, Manual, Replay, Step, down, engine, obs, ticks

PAUSE, RESUME, DRAIN, RESTART = "pause_admission", "resume_admission", "drain", "restart"
DONE, FAILED = "notify_restart_done", "notify_restart_failed"


def hung(t: float) -> Observation:
    return obs(t, engine(running=4, stalled_s=200))


def test_steps_reported_by_the_shell() -> None:
    replay = Replay()
    series: list[Step] = [
        obs(0),
        Manual(1, ManualAction.RESTART),
        Event(2, ProcedureEvent.DRAINED, "0 running"),
        obs(4),  # still waiting for the adapter
        Event(5, ProcedureEvent.RESTART_ACCEPTED, "systemctl restart vllm.service: done"),
        Event(6, ProcedureEvent.HEALTHY_AGAIN),
        obs(8),
        Event(9, ProcedureEvent.HEALTHY_AGAIN),  # seen twice: the second is ignored
    ]
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "draining", (PAUSE, DRAIN)),
        (2.0, "restarting", (RESTART,)),
        (6.0, "cooldown", (RESUME, DONE)),
    ]
    assert replay.at(2).actions[0].reason == "drained: 0 running; restarting vLLM (manual): restart asked by hand"
    assert replay.at(5).reason.startswith("restart (manual) accepted by the adapter: systemctl restart vllm.service")
    # Timed from the restart's start, each part named: not "1 s after" for a restart that took 5.
    assert replay.at(6).actions[1].reason == (
        "vLLM healthy again 5 s after the restart (manual) began: drain 1 s, restart adapter 3 s, then 1 s until "
        "healthy and polled"
    )
    assert replay.at(9).reason == "ignored healthy_again: no step of the restart waits for it (idle)"
    assert replay.at(9).state is PolicyState.COOLDOWN
    assert len(replay.ledger.records) == 1


def test_drained_needs_a_poll_after_the_pause() -> None:
    # Running was already 0 when the restart began: still one poll later, so the load balancer sees 503 first.
    replay = Replay()
    rows = replay.run([obs(0, engine(running=0)), Manual(1, ManualAction.RESTART), obs(1, engine(running=0))])
    assert rows == [(0.0, "normal", ()), (1.0, "draining", (PAUSE, DRAIN))]
    assert replay.run([obs(3, engine(running=0))]) == [(3.0, "restarting", (RESTART,))]


def test_not_now_backs_off_and_retries_with_a_doubling_wait() -> None:
    series: list[Step] = [hung(0)]
    series += [Event(1, ProcedureEvent.RESTART_NOT_NOW, "HTTP 429: PodDisruptionBudget")]
    series += [hung(t) for t in ticks(2, 62)]
    series += [Event(63, ProcedureEvent.RESTART_NOT_NOW, "HTTP 429: PodDisruptionBudget")]
    series += [hung(t) for t in ticks(64, 190)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "restarting", (PAUSE, DRAIN, RESTART)),  # a hung engine: no drain
        (1.0, "paused", (FAILED,)),  # back to paused: vLLM still answers but is still hung, so it ...
        (62.0, "restarting", (DRAIN, RESTART)),  # ... stays out of rotation until the next attempt, 60 s later
        (63.0, "paused", (FAILED,)),
        (184.0, "restarting", (DRAIN, RESTART)),  # 120 s later
    ]
    assert replay.at(1).reason == (
        "restart (engine_hung) refused for now by the platform: HTTP 429: PodDisruptionBudget; next attempt in 60 s"
    )
    assert replay.at(2).would_restart_but == "the platform refused the last restart for now; next attempt in 59 s"
    assert replay.ledger.records == ()  # nothing restarted: nothing counts against the budget


def test_restart_failed_latches_until_a_manual_action() -> None:
    series: list[Step] = [hung(0)]
    series += [Event(1, ProcedureEvent.RESTART_FAILED, "HTTP 403: forbidden")]
    series += [hung(t) for t in ticks(2, 198)]
    series += [Manual(199, ManualAction.RESUME), hung(200)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "restarting", (PAUSE, DRAIN, RESTART)),
        (1.0, "failed", (FAILED,)),  # automatic restarts stay off; the stalled engine keeps admission paused
        (199.0, "pressure", (RESUME,)),  # the manual resume clears the latch and the pause
        (200.0, "restarting", (PAUSE, DRAIN, RESTART)),
    ]
    assert replay.at(1).actions[0].reason == (
        "restart (engine_hung) failed: the restart adapter failed: HTTP 403: forbidden; "
        "automatic restarts are off until a manual restart or resume"
    )
    blocked = replay.at(150).would_restart_but
    assert blocked is not None
    assert blocked.startswith("automatic restarts are off after a failed restart")
    assert replay.at(150).actions == ()


def test_startup_timeout_keeps_admission_paused_until_vllm_recovers() -> None:
    series: list[Step] = [obs(0), Manual(1, ManualAction.RESTART), obs(2, engine(running=0))]
    series += [Event(3, ProcedureEvent.RESTART_ACCEPTED)]
    series += [down(t, since_poll_s=t - 2) for t in ticks(4, 998)]
    series += [obs(t) for t in ticks(1000, 1070)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "draining", (PAUSE, DRAIN)),
        (2.0, "restarting", (RESTART,)),
        (904.0, "failed", (FAILED,)),  # 901 s after the acceptance
        (1000.0, "cooldown", (RESUME,)),  # back by itself: latch cleared, cooldown from now
        (1060.0, "normal", ()),
    ]
    failed = replay.at(904)
    assert failed.admission_paused
    assert failed.actions[0].reason.startswith("restart (manual) failed: vLLM not healthy 901 s after the restart;")
    assert replay.at(950).actions == ()  # no restart of a vLLM that was never healthy since: no loop


def test_an_adapter_that_never_answers_ends_in_failed() -> None:
    series: list[Step] = [obs(0), Manual(1, ManualAction.RESTART), obs(2, engine(running=0))]
    series += [obs(t) for t in ticks(4, 904)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "draining", (PAUSE, DRAIN)),
        (2.0, "restarting", (RESTART,)),
        (902.0, "failed", (FAILED,)),
        (904.0, "failed", (RESUME,)),
    ]
    assert "the restart adapter gave no answer in 900 s" in replay.at(902).reason


def test_vllm_dying_while_draining_is_restarted_at_once() -> None:
    series: list[Step] = [obs(0), Manual(1, ManualAction.RESTART)]
    series += [down(t, since_poll_s=t - 0) for t in ticks(2, 40)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "draining", (PAUSE, DRAIN)),
        (32.0, "restarting", (RESTART,)),  # 30 s unhealthy: nothing left to drain
    ]
    assert replay.at(32).reason.startswith("vLLM not healthy for 30 s, nothing to drain")


def test_events_that_do_not_fit_are_ignored() -> None:
    replay = Replay()
    replay.step(obs(0))
    for event in ProcedureEvent:
        decision = replay.step(Event(1, event))
        assert decision.state is PolicyState.NORMAL
        assert decision.actions == ()
        assert decision.reason == f"ignored {event}: no step of the restart waits for it (idle)"
    replay.step(Manual(2, ManualAction.RESTART))
    assert replay.step(Event(3, ProcedureEvent.RESTART_ACCEPTED)).reason.startswith("ignored restart_accepted")
    assert replay.step(Event(3, ProcedureEvent.HEALTHY_AGAIN)).state is PolicyState.DRAINING
    assert replay.ledger.records == ()


def test_the_decision_carries_what_the_shell_logs_exports_and_notifies() -> None:
    replay = Replay()
    replay.run([hung(0), Event(121, ProcedureEvent.RESTART_ACCEPTED)])
    begun = replay.at(0)
    assert [a.kind for a in begun.actions] == [ActionKind.PAUSE_ADMISSION, ActionKind.DRAIN, ActionKind.RESTART]
    assert [a.cause for a in begun.actions] == [RestartReason.ENGINE_HUNG] * 3
    assert begun.restart_reason is RestartReason.ENGINE_HUNG
    assert begun.pause_reason == (
        "restarting vLLM (engine_hung): engine 0 made no progress for 200 s >= 120 s with 4 requests running (hung)"
    )
    accepted = replay.at(121)
    assert accepted.restarts_in_budget_window == 1
    assert accepted.cooldown_remaining_s == 60
    assert (
        replay.ledger.records[0].detail == "engine 0 made no progress for 200 s >= 120 s with 4 requests running (hung)"
    )
