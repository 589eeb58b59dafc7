"""The engine probe in replays: every wedge seen, a slow engine never restarted for being slow, no evidence
never taken for a wedge. Time is the policy's own (each tick's `now`), so a minute passes in no time."""

from __future__ import annotations

from sidecar.model.derived import EngineDerived
from sidecar.policy import Observation, PolicySettings, ProcedureEvent
from sidecar.policy.probe import ProbeOutcome
from tests.policy.builders import Event, Probe, Replay, Step, engine, obs, ticks

PAUSE, RESUME, DRAIN, RESTART, PROBE = "pause_admission", "resume_admission", "drain", "restart", "probe_engine"
ANSWERED, NO_ANSWER, INCONCLUSIVE = ProbeOutcome.ANSWERED, ProbeOutcome.NO_ANSWER, ProbeOutcome.INCONCLUSIVE
WEDGE_LINE = "a 1-token probe completion got no answer in 60 s"


def idle(quiet_s: float) -> EngineDerived:
    """Metrics that read idle: 0 running, 0 waiting, counters still for `quiet_s`."""
    return engine(running=0, waiting=0, stalled_s=0, quiet_s=quiet_s)


def busy_stalled(stalled_s: float) -> EngineDerived:
    return engine(running=4, stalled_s=stalled_s, quiet_s=stalled_s)


def at(t: float, e: EngineDerived) -> Observation:
    return obs(t, e)


def test_an_idle_server_is_probed_once_a_minute_and_its_answer_changes_nothing() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 60)]
    series += [Probe(60.4, ANSWERED, "HTTP 200 in 0.4 s")]
    # The probe's tokens moved the counters: quiet again from 60.
    series += [at(t, idle(t - 60)) for t in ticks(62, 124)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (60.0, "normal", (PROBE,)),
        (120.0, "normal", (PROBE,)),  # 60 s after the last one: one token a minute
    ]
    assert replay.at(60).actions[0].reason == (
        "engine 0 made no progress for 60 s: probing it with a 1-token completion (an engine wedged while idle "
        "reads idle)"
    )
    assert replay.at(60.4).reason == "probe answered after 0 s: HTTP 200 in 0.4 s; the engine works"


def test_an_engine_wedged_while_idle_is_paused_then_restarted_though_its_metrics_read_idle() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 118)]
    series += [Probe(120, NO_ANSWER, "no answer within 60 s")]
    series += [at(t, idle(t)) for t in ticks(120, 124)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (60.0, "normal", (PROBE,)),
        (70.0, "paused", (PAUSE,)),  # one token unanswered for 10 s: no more traffic for it
        (120.0, "restarting", (DRAIN, RESTART)),  # no answer in 60 s and nothing moved: a wedge, no drain
    ]
    assert replay.at(70).actions[0].reason == "a 1-token probe completion has had no answer for 10 s"
    restart = replay.at(120).actions[-1].reason
    assert restart == (
        "engine hung, nothing will finish: no drain; restarting vLLM (engine_hung): engine 0 made no progress "
        f"for 120 s >= 120 s, and {WEDGE_LINE} (hung)"
    )


def test_a_busy_wedge_is_probed_before_the_restart_and_restarted_within_hung_after_plus_the_probe() -> None:
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 120)]
    series += [Probe(120.5, NO_ANSWER, "no answer within 60 s")]  # the probe sent at 60 times out
    series += [at(t, busy_stalled(t)) for t in ticks(122, 126)]
    replay = Replay(PolicySettings())
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (2.0, "pressure", ()),
        (10.0, "paused", (PAUSE,)),  # the stall pauses admission at 10 s
        (60.0, "paused", (PROBE,)),  # a minute without progress: ask it one token
        (122.0, "restarting", (DRAIN, RESTART)),  # no answer: a wedge, restarted without a drain
    ]
    assert replay.at(120).would_restart_but is None  # at hung_after, the probe is still out: not yet


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
    assert probed == [60.0, 120.0, 180.0, 240.0, 300.0]  # asked again each minute, answered each time


def test_a_probe_that_says_nothing_leaves_the_hung_rule_to_the_stall_alone() -> None:
    series: list[Step] = [at(t, busy_stalled(t)) for t in ticks(0, 60)]
    series += [Probe(61, INCONCLUSIVE, "HTTP 401: the server wants an API key (--vllm-api-key-file)")]
    series += [at(t, busy_stalled(t)) for t in ticks(62, 122)]
    replay = Replay(PolicySettings())
    assert replay.run(series)[-1] == (120.0, "restarting", (DRAIN, RESTART))
    assert replay.at(61).reason.endswith("no evidence either way; the stall alone decides")


def test_progress_after_an_unanswered_probe_is_no_wedge() -> None:
    # The answer timed out, but tokens moved since it was sent: the engine works (the probe was lost).
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 118)]
    series += [Probe(120, NO_ANSWER, "no answer within 60 s")]
    series += [at(t, idle(5)) for t in ticks(120, 140)]
    rows = Replay(PolicySettings()).run(series)
    assert all(RESTART not in actions for _, _, actions in rows)
    assert rows[-1] == (120.0, "normal", (RESUME,))


def test_an_answer_after_the_restart_is_ignored_and_the_new_vllm_starts_afresh() -> None:
    series: list[Step] = [at(t, idle(t)) for t in ticks(0, 118)]
    series += [Probe(120, NO_ANSWER, "no answer within 60 s"), at(120, idle(120))]
    series += [Event(121, ProcedureEvent.RESTART_ACCEPTED), Probe(122, ANSWERED, "late")]
    replay = Replay(PolicySettings())
    replay.run(series)
    assert replay.at(122).reason == "probe answer ignored (answered): no probe is out (vLLM was restarted since)"


def test_with_probes_off_an_idle_wedge_goes_unseen_and_a_busy_one_restarts_on_its_stall() -> None:
    off = PolicySettings(probe_after_s=0)
    assert all(not actions for _, _, actions in Replay(off).run([at(t, idle(t)) for t in ticks(0, 600)]))
    rows = Replay(off).run([at(t, busy_stalled(t)) for t in ticks(0, 130)])
    assert rows[-1] == (120.0, "restarting", (DRAIN, RESTART))
