"""Replays of restarts and their guards: recorded series through the Policy, against golden (t, state, actions).

Each golden is written out by hand from the issue's rules, not computed from the code. A row appears for
every step whose state changed or that took an action; the series tick every 2 s unless said otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from sidecar.model.supervision import Restarter
from sidecar.policy import (
    ManualAction,
    Observation,
    ProcedureEvent,
    RestartLedger,
    RestartReason,
    RestartRecord,
)
from tests.policy.builders import WALL0, Event, Manual, Replay, Step, down, engine, gpu, no_probe, obs, ticks

PAUSE, RESUME, DRAIN, RESTART = "pause_admission", "resume_admission", "drain", "restart"
DONE, BUDGET = "notify_restart_done", "notify_budget_exhausted"


def test_memory_leak_restarts_in_a_planned_way_once_vllm_is_old_enough() -> None:
    def tick(t: float) -> Observation:
        tto = None if t < 580 or t >= 604 else 1000 - 30 * (t - 580)  # under 900 s from 584 s on
        return obs(t, engine(running=0 if t >= 604 else 4), gpus=(gpu(time_to_oom_s=tto),))

    series: list[Step] = [tick(t) for t in ticks(0, 604)]
    series += [Event(605, ProcedureEvent.RESTART_ACCEPTED)]
    series += [obs(t, engine(running=2), gpus=(gpu(),)) for t in ticks(606, 680)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (584.0, "pressure", ()),  # forecast under 900 s, tick 1 of 3
        # 588 s: 3 ticks, but vLLM has been up only 588 s < 600 s: held (pressure, would_restart_but)
        (600.0, "draining", (PAUSE, DRAIN)),
        (604.0, "restarting", (RESTART,)),  # drained: 0 running
        (606.0, "cooldown", (RESUME, DONE)),
        (666.0, "normal", ()),  # 60 s cooldown from vLLM's return
    ]
    held = replay.at(588)
    assert held.would_restart_but == "vLLM up only 588 s < 600 s before a forecast-driven restart"
    assert held.restart_reason is RestartReason.OOM_FORECAST
    assert (
        replay.at(600)
        .actions[1]
        .reason.startswith("restart (oom_forecast) begins: forecast time to OOM 400 s < 900 s for 9 ticks on GPU 0;")
    )
    assert [r.reason for r in replay.ledger.records] == [RestartReason.OOM_FORECAST]


@pytest.mark.parametrize(("no_answer", "at_600"), [(True, "draining"), (False, "pressure")])
def test_a_slow_health_answer_keeps_the_uptime_a_failing_one_restarts_it(no_answer: bool, at_600: str) -> None:
    # At 590 s neither /metrics nor /health answered in time (a loaded server: the same process), or /health
    # answered 503 (its engine died). Only the death counts vLLM's uptime again from its return.
    def tick(t: float) -> Observation:
        return obs(t, engine(running=0), gpus=(gpu(time_to_oom_s=None if t < 580 else 300.0),))

    slow = dataclasses.replace(down(590, since_poll_s=2.0), vllm_slow=no_answer)
    replay = Replay()
    replay.run([*(tick(t) for t in ticks(0, 588)), slow, *(tick(t) for t in ticks(592, 600))])
    assert replay.at(600).state.value == at_600
    if not no_answer:
        assert replay.at(600).would_restart_but == "vLLM up only 8 s < 600 s before a forecast-driven restart"


def test_the_uptime_guard_reads_whole_seconds_down() -> None:
    # 599.6 s rounded would read "600 s < 600 s": a guard contradicting itself.
    def tick(t: float) -> Observation:
        return obs(t, engine(running=4), gpus=(gpu(time_to_oom_s=None if t < 580 else 300.0),))

    replay = Replay()
    replay.run([*(tick(t) for t in ticks(0, 598)), tick(599.6)])
    assert replay.at(599.6).would_restart_but == "vLLM up only 599 s < 600 s before a forecast-driven restart"


def test_a_hung_engine_is_restarted_without_waiting_for_a_drain_it_cannot_finish() -> None:
    def tick(t: float) -> Observation:
        return obs(t, engine(running=4, stalled_s=max(0.0, t - 10)))

    series: list[Step] = [tick(t) for t in ticks(0, 130)]
    series += [Event(131, ProcedureEvent.RESTART_ACCEPTED)]
    series += [obs(t, engine(running=2)) for t in ticks(132, 200)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (12.0, "pressure", ()),  # no progress for 2 s with requests running
        (20.0, "paused", (PAUSE,)),  # 10 s: new requests would only queue behind it
        (130.0, "restarting", (DRAIN, RESTART)),  # 120 s without progress: its requests cannot finish
        (132.0, "cooldown", (RESUME, DONE)),
        (192.0, "normal", ()),
    ]
    drain, restart = replay.at(130).actions
    assert drain.reason.endswith("(hung); admission paused, no drain")  # not "waiting up to 120 s"
    assert restart.reason.startswith("engine hung, nothing will finish: no drain; restarting vLLM (engine_hung)")


def test_a_drain_ends_as_soon_as_the_engine_stops_making_progress() -> None:
    # A planned restart drains; the engine stalls during the drain: nothing will finish, so no 120 s wait.
    series: list[Step] = [obs(0), Manual(1, ManualAction.RESTART)]
    series += [obs(t, engine(running=3, stalled_s=max(0.0, t - 4))) for t in ticks(2, 30)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (1.0, "draining", (PAUSE, DRAIN)),
        (14.0, "restarting", (RESTART,)),
    ]
    assert (
        replay.at(14)
        .actions[0]
        .reason.startswith(
            "no engine progress for 10 s during the drain, nothing will finish; restarting vLLM (manual)"
        )
    )


def test_dead_engine_restarts_without_draining() -> None:
    series: list[Step] = [obs(t) for t in ticks(0, 20)]
    series += [down(t, since_poll_s=t - 20) for t in ticks(22, 52)]
    series += [Event(53, ProcedureEvent.RESTART_ACCEPTED)]
    series += [down(t, since_poll_s=t - 20) for t in ticks(54, 118)]  # loading: no /health yet
    series += [obs(t) for t in ticks(120, 190)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (22.0, "pressure", ()),  # /health failing, not yet 30 s
        (52.0, "restarting", (PAUSE, DRAIN, RESTART)),  # 30 s failing: nothing to drain on a dead engine
        (120.0, "cooldown", (RESUME, DONE)),
        (180.0, "normal", ()),
    ]
    assert replay.at(52).reason.startswith(
        "engine dead, nothing to drain; restarting vLLM (engine_dead): vLLM /health failing for 30 s >= 30 s"
    )


def test_flapping_health_never_adds_up_to_dead() -> None:
    series = [obs(t) for t in ticks(0, 20)]
    for start in (22, 42, 62, 82, 102):  # 10 s down, 10 s up
        series += [down(t, since_poll_s=t - start + 2) for t in ticks(start, start + 8)]
        series += [obs(t) for t in ticks(start + 10, start + 18)]
    assert Replay().run(series) == [
        (0.0, "normal", ()),
        (22.0, "pressure", ()),
        (32.0, "normal", ()),
        (42.0, "pressure", ()),
        (52.0, "normal", ()),
        (62.0, "pressure", ()),
        (72.0, "normal", ()),
        (82.0, "pressure", ()),
        (92.0, "normal", ()),
        (102.0, "pressure", ()),
        (112.0, "normal", ()),
    ]


def _hung_from(t0: float, t: float, wall_offset_s: float) -> Observation:
    return obs(t, engine(running=4, stalled_s=max(0.0, t - t0 + 100)), wall_s=WALL0 + wall_offset_s + t)


def test_a_sidecar_restart_mid_budget_keeps_the_budget() -> None:
    first = Replay()
    for start in (0.0, 1000.0):  # two manual restarts, 1000 s apart
        first.step(obs(start))
        first.step(Manual(start + 1, ManualAction.RESTART))
        first.step(obs(start + 2, engine(running=0)))
        first.step(Event(start + 3, ProcedureEvent.RESTART_ACCEPTED))
        first.step(obs(start + 4))
    persisted = json.dumps(first.ledger.to_dict())

    # The sidecar restarts: a new process, a new monotonic clock, the wall clock 1500 s on.
    second = Replay(ledger=RestartLedger.from_dict(json.loads(persisted)))
    series: list[Step] = [obs(0, wall_s=WALL0 + 1500)]
    series += [_hung_from(2, t, 1500) for t in ticks(2, 142)]
    series += [Event(143, ProcedureEvent.RESTART_ACCEPTED)]
    series += [obs(t, wall_s=WALL0 + 1500 + t) for t in ticks(144, 400)]
    series += [_hung_from(402, t, 1500) for t in ticks(402, 428)]
    rows = []
    for item in series:
        if isinstance(item, Event):  # this process's wall clock is 1500 s on from the first one's
            wall = WALL0 + 1500 + item.t
            decision, second.ledger = second.policy.procedure_event(item.event, item.t, wall, second.ledger)
        else:
            decision = second.step(item)
        if decision.actions or decision.state != decision.previous_state:
            rows.append((decision.now_s, decision.state.value, tuple(a.kind.value for a in decision.actions)))
    assert rows == [
        (0.0, "normal", ()),  # the last restart was 497 s ago: its 120 s cooldown is over
        (2.0, "paused", (PAUSE,)),  # stalled for 100 s already: no traffic for it
        (22.0, "restarting", (DRAIN, RESTART)),  # restart 3 of the hour; a hung engine is not drained
        (144.0, "cooldown", (RESUME, DONE)),  # third in a series: 240 s
        (384.0, "normal", ()),
        (402.0, "paused", (PAUSE,)),  # hung again, 100 s without progress
        (422.0, "paused", (BUDGET,)),  # restart 4 refused, notified once; the hung engine stays out of rotation
    ]
    refused = second.policy.decide(_hung_from(402, 430, 1500), second.ledger)
    assert refused.actions == ()
    assert refused.would_restart_but == "restart budget exhausted: 3 restarts in the last hour, next allowed in 1673 s"
    assert refused.restarts_in_budget_window == 3
    assert [r.reason for r in second.ledger.records] == [RestartReason.MANUAL] * 2 + [RestartReason.ENGINE_HUNG]


def _three_recent_restarts(*ages_s: float) -> RestartLedger:
    return RestartLedger(
        records=tuple(RestartRecord(wall_time_s=WALL0 - a, reason=RestartReason.ENGINE_HUNG) for a in ages_s)
    )


def _hung_with_wall(wall: Callable[[float], float]) -> list[Observation]:
    return [obs(t, engine(running=4, stalled_s=200), wall_s=wall(t)) for t in ticks(0, 3600, 60)]


def test_budget_without_clock_trouble() -> None:
    replay = Replay(ledger=_three_recent_restarts(600, 400, 200))
    assert replay.run(_hung_with_wall(lambda t: WALL0 + t)) == [
        (0.0, "paused", (PAUSE, BUDGET)),  # no restart allowed, but no traffic for a hung engine either
        (3000.0, "restarting", (DRAIN, RESTART)),  # the oldest restart left the hour; a hung engine is not drained
    ]


def test_wall_clock_a_day_behind_at_start_counts_the_future_restarts_for_an_hour() -> None:
    replay = Replay(ledger=_three_recent_restarts(600, 400, 200))
    assert replay.run(_hung_with_wall(lambda t: WALL0 - 86_400 + t)) == [
        (0.0, "paused", (PAUSE, BUDGET)),  # restarts "in the future": they just happened
        (3600.0, "restarting", (DRAIN, RESTART)),  # an hour on the monotonic clock, not a day
    ]
    assert replay.at(0).would_restart_but == (
        "restart budget exhausted: 3 restarts in the last hour, next allowed in 3600 s"
    )


def test_wall_clock_jumps_after_first_sight_change_nothing() -> None:
    def back(t: float) -> float:
        return WALL0 + t - (86_400 if t >= 600 else 0)

    def forward(t: float) -> float:
        return WALL0 + t + (86_400 if t >= 600 else 0)

    for wall in (back, forward):
        replay = Replay(ledger=_three_recent_restarts(600, 400, 200))
        assert replay.run(_hung_with_wall(wall)) == [
            (0.0, "paused", (PAUSE, BUDGET)),
            (3000.0, "restarting", (DRAIN, RESTART)),
        ]


def _gone(t: float, since_poll_s: float, *, restarter: Restarter = Restarter.UNKNOWN, detail: str = "") -> Observation:
    """Nothing listens at vLLM's address: its process is gone (a supervisor is most likely restarting it)."""
    tick = down(t, since_poll_s=since_poll_s)
    return Observation(
        now_s=tick.now_s,
        wall_time_s=tick.wall_time_s,
        poll_ok=False,
        vllm_healthy=False,
        data_age_s=tick.data_age_s,
        derived=tick.derived,
        vllm_down=True,
        restarter=restarter,
        restarter_detail=detail,
    )


def test_a_vllm_back_by_itself_after_it_was_gone_is_reported_once() -> None:
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [_gone(t, since_poll_s=t - 10) for t in ticks(12, 60)]  # its supervisor reloads it: 50 s
    series += [obs(t) for t in ticks(62, 80)]
    replay = Replay()
    rows = replay.run(series)
    recovered = [row for row in rows if "notify_vllm_recovered" in row[2]]
    assert recovered == [(62.0, "normal", ("notify_vllm_recovered",))]
    assert replay.at(62).actions[0].reason == (
        "vLLM is healthy again: nothing listened at its address for 50 s, and it came back without a restart by "
        "the sidecar"
    )


def test_a_dead_engine_back_by_itself_while_the_restart_is_refused_is_reported() -> None:
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [down(t, since_poll_s=t - 10) for t in ticks(12, 60)]  # /health failing 48 s: dead, but...
    series += [obs(t) for t in ticks(62, 70)]
    replay = Replay(no_probe(max_restarts_per_hour=0))  # ... automatic restarts are off
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (12.0, "pressure", ()),
        (42.0, "down", ("notify_budget_exhausted",)),  # dead past dead_after_s: down, the guard says why
        (62.0, "normal", ("notify_vllm_recovered",)),
    ]
    assert (
        replay.at(62).actions[0].reason.startswith("vLLM is healthy again: its /health failed for 48 s")
    )  # 12 to 60 s, as seen


def test_a_health_blip_shorter_than_dead_after_is_no_recovery_to_report() -> None:
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [down(t, since_poll_s=t - 10) for t in ticks(12, 30)]  # 20 s < dead_after_s (30 s)
    series += [obs(t) for t in ticks(32, 40)]
    assert [row for row in Replay().run(series) if row[2]] == []


def test_a_vllm_gone_that_nobody_else_restarts_is_restarted_after_10_s_and_reads_down_meanwhile() -> None:
    # The exec adapter, or a systemd unit stopped with no job queued (vLLM exited 0 after its engine died,
    # under Restart=on-failure): the sidecar is the only one who will start it.
    said = "unit vllm.service inactive (dead), no job queued"
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [_gone(t, since_poll_s=t - 10, restarter=Restarter.SIDECAR, detail=said) for t in ticks(12, 24)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (12.0, "down", ()),
        (22.0, "restarting", ("pause_admission", "drain", "restart")),  # down 10 s: no drain, restart
    ]
    assert replay.at(14).reason == (
        "down: nothing listens at vLLM's address for 2 s (its process is gone and nobody else will start it: "
        f"{said}); restart after 10 s"
    )
    assert (
        replay.at(22)
        .actions[-1]
        .reason.endswith(
            f"nothing listens at vLLM's address for 10 s >= 10 s (its process is gone and nobody else will start "
            f"it: {said})"
        )
    )


def test_a_vllm_its_supervisor_is_restarting_is_left_to_it_and_reads_down() -> None:
    said = "unit vllm.service activating (auto-restart)"
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [_gone(t, since_poll_s=t - 10, restarter=Restarter.SUPERVISOR, detail=said) for t in ticks(12, 300)]
    series += [obs(t) for t in ticks(302, 304)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (12.0, "down", ()),
        (302.0, "normal", ("notify_vllm_recovered",)),
    ]
    assert replay.at(300).reason == (
        "down: nothing listens at vLLM's address for 288 s (its process is gone and its supervisor is "
        f"bringing it back: {said}); restart after 900 s"
    )


def test_a_vllm_stopped_on_purpose_is_never_restarted_and_reads_down() -> None:
    # `systemctl stop vllm`: a person stopped it, and starting it again would undo that. Two hours, no restart.
    said = "unit vllm.service inactive (dead), result success: stopped by a stop job (systemctl stop)"
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [_gone(t, since_poll_s=t - 10, restarter=Restarter.OPERATOR, detail=said) for t in ticks(12, 7200)]
    series += [obs(t) for t in ticks(7202, 7204)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (12.0, "down", ()),
        (7202.0, "normal", ("notify_vllm_recovered",)),  # started again by whoever stopped it
    ]
    assert replay.at(7200).reason == (
        f"down: nothing listens at vLLM's address for 7188 s (it was stopped on purpose: {said}); left stopped "
        "until someone starts it (or POST /admin/restart)"
    )


def test_a_blip_is_measured_between_the_polls_that_saw_it_failing() -> None:
    # /health timed out on two polls 9.7 s apart (a busy host), then answered 200 at 14 s. It was seen failing
    # for 9.7 s < dead_after 10 s: a blip, not a death, so there is nothing to report as a recovery, though
    # the healthy answer came 14 s after the first failure (what happened between the polls is unknown).
    settings = no_probe(dead_after_s=10.0)
    series: list[Step] = [obs(t) for t in ticks(0, 10)]
    series += [down(12.0, since_poll_s=2.0, health=False), down(21.7, since_poll_s=11.7, health=False)]
    series += [obs(t) for t in ticks(26, 40)]
    replay = Replay(settings)
    rows = replay.run(series)
    assert not [row for row in rows if "notify_vllm_recovered" in row[2] or RESTART in row[2]], rows
