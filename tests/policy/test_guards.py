"""The guards one at a time: stale data, health signals, budget, cooldown, uptime; and the clock handling."""

from __future__ import annotations

import pytest

from sidecar.model.derived import Derived
from sidecar.policy import (
    ActionKind,
    Observation,
    Policy,
    PolicySettings,
    PolicyState,
    RestartLedger,
    RestartReason,
    RestartRecord,
)
from sidecar.policy.guards import RecordClock, guard_view
from sidecar.policy.observation import ObservationError
from tests.policy.builders import WALL0, Replay, down, engine, gpu, no_probe, obs, ticks

DRAIN, RESTART = "drain", "restart"


def ledger(*ages_s: float) -> RestartLedger:
    return RestartLedger(
        records=tuple(RestartRecord(wall_time_s=WALL0 - a, reason=RestartReason.ENGINE_HUNG) for a in ages_s)
    )


def test_no_restart_on_stale_data_even_when_the_last_values_say_hung() -> None:
    replay = Replay()
    replay.step(obs(0))
    stale = Observation(
        now_s=10,
        wall_time_s=WALL0 + 10,
        poll_ok=False,
        vllm_healthy=True,
        data_age_s=8,
        derived=Derived(engines=(engine(stalled_s=500),), gpus=(), problems=()),
    )
    decision = replay.step(stale)
    assert decision.actions == ()
    assert decision.reason == "holding, no fresh data (last poll 8 s ago, stale after 6 s)"


def test_without_health_checks_an_unreadable_metrics_endpoint_is_the_health_signal() -> None:
    series = [obs(t, healthy=None) for t in ticks(0, 10)]
    series += [down(t, since_poll_s=t - 10, health=None) for t in ticks(12, 42)]
    rows = Replay().run(series)
    assert rows == [
        (0.0, "normal", ()),
        (12.0, "pressure", ()),
        (42.0, "restarting", ("pause_admission", DRAIN, "restart")),
    ]


def test_a_health_break_restarts_the_uptime_for_the_forecast_rule() -> None:
    def leak(t: float) -> Observation:
        return obs(t, gpus=(gpu(time_to_oom_s=400),))

    series = [leak(t) for t in ticks(0, 100)]
    series += [down(t, since_poll_s=t - 100, health=False) for t in (102, 104)]
    series += [leak(t) for t in ticks(106, 720)]
    rows = Replay().run(series)
    # Up 0..100 s, then from 106 s: 600 s of uptime at 706 s.
    assert rows == [(0.0, "pressure", ()), (706.0, "draining", ("pause_admission", DRAIN))]


def test_budget_exhaustion_notifies_once_however_long_the_restart_stays_due() -> None:
    replay = Replay(ledger=ledger(1800, 1200, 600))
    decisions = [replay.step(obs(t, engine(stalled_s=300))) for t in ticks(0, 100)]
    notified = [d.now_s for d in decisions if any(a.kind is ActionKind.NOTIFY_BUDGET_EXHAUSTED for a in d.actions)]
    assert notified == [0.0]
    budget = next(a for a in decisions[0].actions if a.kind is ActionKind.NOTIFY_BUDGET_EXHAUSTED)
    assert budget.reason == (
        "restart budget exhausted: 3 restarts in the last hour, next allowed in 1800 s; restart due: "
        "engine 0 made no progress for 300 s >= 120 s with 4 requests running (hung)"
    )
    assert decisions[-1].state is PolicyState.PAUSED  # a hung engine the budget cannot restart gets no traffic
    # The condition clears and comes back while the budget is still spent: still no second notification.
    later = [replay.step(obs(t)) for t in ticks(102, 110)] + [
        replay.step(obs(t, engine(stalled_s=300))) for t in ticks(112, 120)
    ]
    assert not [a for d in later for a in d.actions if a.kind is ActionKind.NOTIFY_BUDGET_EXHAUSTED]


def test_zero_restarts_per_hour_disables_automatic_restarts() -> None:
    replay = Replay(no_probe(max_restarts_per_hour=0))
    decision = replay.step(obs(0, engine(stalled_s=300)))
    assert decision.would_restart_but == "automatic restarts are disabled (max_restarts_per_hour = 0)"
    assert [a.kind for a in decision.actions] == [ActionKind.PAUSE_ADMISSION, ActionKind.NOTIFY_BUDGET_EXHAUSTED]


@pytest.mark.parametrize(
    ("ages_s", "max_per_hour", "restart_at_s"),
    [
        ((30,), 3, 30),  # 1st of a series: 60 s
        ((630, 30), 3, 90),  # 2nd: 120 s
        ((1230, 630, 30), 10, 210),  # 3rd: 240 s
        ((5030, 30), 3, 30),  # 5000 s apart: a new series, 60 s again
    ],
)
def test_exponential_cooldown(ages_s: tuple[float, ...], max_per_hour: int, restart_at_s: float) -> None:
    replay = Replay(no_probe(max_restarts_per_hour=max_per_hour), ledger=ledger(*ages_s))
    rows = replay.run(obs(t, engine(stalled_s=300)) for t in ticks(0, restart_at_s + 100))
    assert rows == [(0.0, "paused", ("pause_admission",)), (restart_at_s, "restarting", (DRAIN, RESTART))]
    assert replay.at(0).would_restart_but == (
        f"cooldown after restart {len(ages_s) if ages_s[0] < 3600 else 1} of a series: "
        f"next restart allowed in {restart_at_s:.0f} s"
    )


def test_the_cooldown_runs_from_vllms_return_not_from_the_restart() -> None:
    settings = PolicySettings()
    accepted = ledger(200)  # restarted 200 s ago ...
    view = guard_view(accepted, settings, WALL0, since_healthy_again_s=10)  # ... back for 10 s
    assert view.cooldown_remaining_s == 50
    assert guard_view(accepted, settings, WALL0, since_healthy_again_s=None).cooldown_remaining_s is None


def test_record_clock_ages_by_the_monotonic_clock_after_first_sight() -> None:
    clock, book = RecordClock(), ledger(100, -500)  # one past, one "in the future"
    aged = clock.aged(book, now_s=1000, wall_s=WALL0)
    assert [WALL0 - r.wall_time_s for r in aged.records] == [100, 0]
    # 50 s later on the monotonic clock, whatever the wall clock did.
    for wall in (WALL0 + 50, WALL0 - 86_400, WALL0 + 86_400):
        aged = clock.aged(book, now_s=1050, wall_s=wall)
        assert [wall - r.wall_time_s for r in aged.records] == pytest.approx([150, 50])


def test_a_record_of_this_boot_is_aged_by_the_monotonic_time_it_carries() -> None:
    # Written by an earlier sidecar process 30 s ago on this boot's monotonic clock; the wall clock jumped 4 h
    # forward since, so by wall time alone it would look 4 h old and no longer count against the budget.
    record = RestartRecord(wall_time_s=WALL0 - 4 * 3600, reason=RestartReason.ENGINE_HUNG, monotonic_s=970.0)
    aged = RecordClock().aged(RestartLedger(records=(record,)), now_s=1000.0, wall_s=WALL0)
    assert WALL0 - aged.records[0].wall_time_s == pytest.approx(30.0)
    # A monotonic time ahead of now cannot be this boot's: the wall clock decides, as for any other record.
    later = RestartRecord(wall_time_s=WALL0 - 100, reason=RestartReason.ENGINE_HUNG, monotonic_s=5000.0)
    aged = RecordClock().aged(RestartLedger(records=(later,)), now_s=1000.0, wall_s=WALL0)
    assert WALL0 - aged.records[0].wall_time_s == pytest.approx(100.0)


def test_observations_with_broken_clocks_are_refused() -> None:
    with pytest.raises(ObservationError):
        obs(float("nan"))
    with pytest.raises(ObservationError):
        obs(0, age_s=-1)


def test_policy_defaults_and_settings() -> None:
    assert Policy().settings == PolicySettings()
    decision = Policy().decide(obs(0), RestartLedger())
    assert (decision.state, decision.previous_state) == (PolicyState.NORMAL, PolicyState.STARTING)
    assert not decision.admission_paused
    assert decision.pause_reason is None
    assert decision.reason == "normal: no condition met"
