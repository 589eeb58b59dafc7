"""The engine probe in replays: every wedge seen and restarted within a minute of its stall, a slow or briefly
paused engine never restarted, no evidence never taken for a wedge, and never the first request of a fresh vLLM.
Time is the policy's own (each tick's `now`), so a minute passes in no time.

The defaults these replays hold (stall pause 10 s, probe after 20 s idle, probe timeout 20 s, hung after 50 s)
are what issue 28 measured on a real vLLM on CPU: a restart decided 50 s into a hang leaves a vLLM that starts
in 15-20 s serving again well within 90 s, and a 40 s pause of a live engine is not a hang.
"""

from __future__ import annotations

from sidecar.model.derived import EngineDerived
from sidecar.policy import Observation, PolicySettings, ProcedureEvent
from sidecar.policy.probe import ProbeOutcome
from tests.policy.builders import Event, Probe, Replay, Step, engine, obs, ticks

PAUSE, RESUME, DRAIN, RESTART = "pause_admission", "resume_admission", "drain", "restart"
PROBE, WARM_UP = "probe_engine", "warm_up_engine"
ANSWERED, NO_ANSWER, INCONCLUSIVE = ProbeOutcome.ANSWERED, ProbeOutcome.NO_ANSWER, ProbeOutcome.INCONCLUSIVE
WEDGE_LINE = "a 1-token probe completion got no answer in 20 s"


def idle(quiet_s: float, generated: float | None = None) -> EngineDerived:
    """Metrics that read idle: 0 running, 0 waiting, counters still for `quiet_s`."""
    return engine(running=0, waiting=0, stalled_s=0, quiet_s=quiet_s, generated_tokens=generated)


def busy_stalled(stalled_s: float) -> EngineDerived:
    return engine(running=4, stalled_s=stalled_s, quiet_s=stalled_s)


def at(t: float, e: EngineDerived) -> Observation:
    return obs(t, e)


def test_an_idle_server_is_probed_every_20_s_and_its_answer_changes_nothing() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 20)]
    series += [Probe(20.4, ANSWERED, "HTTP 200 in 0.4 s")]
    # The probe's token moved the counters: quiet again from 20.
    series += [at(t, idle(t - 20)) for t in ticks(22, 44)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (20.0, "normal", (PROBE,)),
        (40.0, "normal", (PROBE,)),  # 20 s after the last one
    ]
    assert replay.at(20).actions[0].reason == (
        "engine 0 made no progress for 20 s: probing it with a 1-token completion (an engine wedged while idle "
        "reads idle)"
    )
    assert replay.at(20.4).reason == "probe answered after 0 s: HTTP 200 in 0.4 s; the engine works"


def test_an_engine_wedged_while_idle_is_paused_then_restarted_though_its_metrics_read_idle() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 38)]
    series += [Probe(40, NO_ANSWER, "no answer within 20 s")]
    series += [at(t, idle(t)) for t in ticks(40, 52)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (20.0, "normal", (PROBE,)),
        (30.0, "paused", (PAUSE,)),  # one token unanswered for 10 s: no more traffic for it
        (50.0, "restarting", (DRAIN, RESTART)),  # no answer in 20 s, nothing moved for 50 s: a wedge, no drain
    ]
    assert replay.at(30).actions[0].reason == "a 1-token probe completion has had no answer for 10 s"
    restart = replay.at(50).actions[-1].reason
    assert restart == (
        "engine hung, nothing will finish: no drain; restarting vLLM (engine_hung): engine 0 made no progress "
        f"for 50 s >= 50 s, and {WEDGE_LINE} (hung)"
    )


def test_a_busy_wedge_is_probed_when_its_stall_pauses_and_restarted_50_s_into_it() -> None:
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 30)]
    series += [Probe(30.5, NO_ANSWER, "no answer within 20 s")]  # the probe sent at 10 times out
    series += [at(t, busy_stalled(t)) for t in ticks(32, 52)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (2.0, "pressure", ()),
        (10.0, "paused", (PAUSE, PROBE)),  # the stall that pauses admission is evidence enough to ask
        (50.0, "restarting", (DRAIN, RESTART)),  # no answer, nothing moved: a wedge, restarted without a drain
    ]
    assert replay.at(10).actions[1].reason == (
        "engine 0 made no progress for 10 s with requests waiting or running: probing it with a 1-token completion"
    )
    assert replay.at(48).would_restart_but is None  # proven at 30.5, but a live engine may pause this long


def test_an_engine_paused_40_s_then_resumed_is_never_restarted() -> None:
    # SIGSTOP for 40 s with requests running, then SIGCONT: the probe times out meanwhile, but the counters
    # move again before hung_after, and the unanswered probe proves nothing once they have.
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 30)]
    series += [Probe(30, NO_ANSWER, "no answer within 20 s")]
    series += [at(t, busy_stalled(t)) for t in ticks(32, 42)]
    series += [at(t, engine(running=4, stalled_s=0, quiet_s=0)) for t in ticks(44, 120)]
    rows = Replay(PolicySettings()).run(series)
    assert all(RESTART not in actions for _, _, actions in rows)
    assert rows[-1] == (44.0, "normal", (RESUME,))  # moving again, and paused for more than min_paused_s


def test_a_probe_that_is_answered_calls_off_the_hung_restart_of_a_long_prefill() -> None:
    # No counter moves for minutes (one huge prefill step), but the engine answers: it is slow, not hung.
    replay = Replay(PolicySettings())
    probed: list[float] = []
    for t in ticks(0, 300):
        decision = replay.step(at(t, busy_stalled(t)))
        assert all(action.kind.value != RESTART for action in decision.actions)
        if any(action.kind.value == PROBE for action in decision.actions):
            probed.append(t)
            replay.step(Probe(t + 1, ANSWERED, "HTTP 200 in 1.0 s"))
    assert probed == [float(t) for t in range(10, 300, 20)]  # asked again every 20 s, answered each time


def test_a_probe_stuck_behind_a_busy_queue_is_no_wedge() -> None:
    # The probe waits behind a saturated queue and times out, but the queue's tokens move the counters.
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 10)]
    series += [at(t, engine(running=8, waiting=30, stalled_s=0, quiet_s=0)) for t in ticks(12, 28)]
    series += [Probe(30, NO_ANSWER, "no answer within 20 s")]
    series += [at(t, engine(running=8, waiting=30, stalled_s=0, quiet_s=0)) for t in ticks(30, 300)]
    rows = Replay(PolicySettings()).run(series)
    assert all(RESTART not in actions for _, _, actions in rows)


def test_a_probe_that_says_nothing_leaves_the_hung_rule_to_the_stall_alone() -> None:
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 10)]
    series += [Probe(11, INCONCLUSIVE, "HTTP 401: the server wants an API key (--vllm-api-key-file)")]
    series += [at(t, busy_stalled(t)) for t in ticks(12, 122)]
    replay = Replay(PolicySettings())
    rows = replay.run(series)
    assert rows[-1] == (120.0, "restarting", (DRAIN, RESTART))  # hung_without_probe_after_s, not hung_after_s
    assert all(RESTART not in actions for _, _, actions in rows[:-1])
    assert replay.at(11).reason.endswith("no evidence either way; the stall alone decides")


def test_progress_after_an_unanswered_probe_is_no_wedge() -> None:
    # The answer timed out, but tokens moved since it was sent: the engine works (the probe was lost).
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 38)]
    series += [Probe(40, NO_ANSWER, "no answer within 20 s")]
    series += [at(t, idle(5)) for t in ticks(40, 60)]
    rows = Replay(PolicySettings()).run(series)
    assert all(RESTART not in actions for _, _, actions in rows)
    assert rows[-1] == (40.0, "normal", (RESUME,))


def test_an_answer_after_the_restart_is_ignored_and_the_new_vllm_starts_afresh() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 38)]
    series += [Probe(40, NO_ANSWER, "no answer within 20 s")]
    series += [at(t, idle(t)) for t in ticks(40, 50)]
    series += [Event(51, ProcedureEvent.RESTART_ACCEPTED), Probe(52, ANSWERED, "late")]
    replay = Replay(PolicySettings())
    replay.run(series)
    assert replay.at(50).state.value == "restarting"
    assert replay.at(52).reason == "probe answer ignored (answered): no probe is out (vLLM was restarted since)"


def test_a_fresh_vllm_gets_a_warm_up_never_the_probe_as_its_first_request() -> None:
    # No token generated since vLLM started: the first request would be the sidecar's. It is a warm-up sized
    # like a real request; once a token was generated (by it or by traffic), probes are the short ones.
    series: list[Step] = [at(t, idle(t, generated=0)) for t in ticks(0, 20)]
    series += [Probe(20.5, ANSWERED, "HTTP 200 in 0.5 s")]
    series += [at(t, idle(t - 20, generated=1)) for t in ticks(22, 40)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [(0.0, "normal", ()), (20.0, "normal", (WARM_UP,)), (40.0, "normal", (PROBE,))]
    assert "warming it up with a 1-token completion sized like a real request" in replay.at(20).actions[0].reason


def test_a_stall_with_requests_in_is_probed_even_before_a_token_was_generated() -> None:
    # Requests are waiting or running: a real request came first, so the short probe is no first request.
    stalled = engine(running=2, stalled_s=10, quiet_s=10, generated_tokens=0)
    assert Replay(PolicySettings()).run([at(0, engine(running=2, generated_tokens=0)), at(10, stalled)]) == [
        (0.0, "normal", ()),
        (10.0, "paused", (PAUSE, PROBE)),
    ]


def test_with_probes_off_an_idle_wedge_goes_unseen_and_a_busy_one_restarts_on_its_stall() -> None:
    off = PolicySettings(probe_after_s=0)
    assert all(not actions for _, _, actions in Replay(off).run([at(t, idle(t)) for t in ticks(0, 600)]))
    rows = Replay(off).run([at(t, busy_stalled(t)) for t in ticks(0, 130)])
    assert rows[-1] == (120.0, "restarting", (DRAIN, RESTART))
