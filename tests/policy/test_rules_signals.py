"""The queue rule on vLLM's queue reasons, an engine vLLM's fault tolerance reports unhealthy, and the preemption
pause judged on the short horizon, from snapshots through the Deriver to the policy, on virtual time."""

from __future__ import annotations

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.derived import Derived
from sidecar.policy import Observation, PauseRule, PolicySettings
from sidecar.policy.rules import next_waiting_streaks, pause_findings, pressure_findings, resume_blockers
from tests.policy.builders import WALL0, Replay, engine, obs
from tests.unit import builders as raw

S = PolicySettings()
PAUSE = "pause_admission"
RESUME = "resume_admission"


def _derived(*engines: object) -> Derived:
    return Derived(engines=engines, gpus=(), problems=())  # type: ignore[arg-type]


def test_deferred_waiting_does_not_count_where_vllm_splits_its_queue() -> None:
    # 10 waiting behind 4 running, but 6 of them wait on a LoRA slot or a KV transfer: 4 for capacity.
    split = engine(running=4.0, waiting=10.0, waiting_capacity=4.0, waiting_deferred=6.0)
    streaks: dict[str, int] = {}
    for _ in range(5):
        streaks = next_waiting_streaks(streaks, _derived(split), S)
    assert streaks == {"m/0": 0}
    assert pause_findings(_derived(split), S, streaks) == []
    assert resume_blockers(_derived(split), S) == []


def test_capacity_bound_waiting_pauses_and_says_so() -> None:
    split = engine(running=4.0, waiting=12.0, waiting_capacity=10.0, waiting_deferred=2.0)
    streaks: dict[str, int] = {}
    for _ in range(2):
        streaks = next_waiting_streaks(streaks, _derived(split), S)
    (pressure,) = pressure_findings(_derived(split), S, streaks, {})
    assert pressure.text == "waiting for capacity > 2 x running for 2 of 3 ticks on engine 0"
    streaks = next_waiting_streaks(streaks, _derived(split), S)
    (found,) = pause_findings(_derived(split), S, streaks)
    assert found.rule is PauseRule.WAITING_QUEUE
    assert found.text == "waiting for capacity 10 (2 deferred not counted) > 2 x running 4 for 3 ticks on engine 0"
    (blocker,) = resume_blockers(_derived(split), S)
    assert blocker.text == "waiting for capacity 10 (2 deferred not counted) > 2 x running 4 on engine 0"
    nothing_deferred = engine(running=4.0, waiting=10.0, waiting_capacity=10.0, waiting_deferred=0.0)
    (found,) = pause_findings(_derived(nothing_deferred), S, streaks)
    assert found.text == "waiting for capacity 10 > 2 x running 4 for 3 ticks on engine 0"


def test_without_a_split_all_waiting_counts_as_before() -> None:
    total = engine(running=4.0, waiting=10.0)
    streaks: dict[str, int] = {}
    for _ in range(3):
        streaks = next_waiting_streaks(streaks, _derived(total), S)
    (found,) = pause_findings(_derived(total), S, streaks)
    assert found.text == "waiting 10 > 2 x running 4 for 3 ticks on engine 0"


def test_an_engine_vllm_reports_unhealthy_pauses_at_once_and_holds_until_healthy() -> None:
    series = [obs(0, engine(healthy=True))]
    series += [obs(2.0 * i, engine(healthy=False, unhealthy_s=2.0 * (i - 1))) for i in range(1, 10)]
    series += [obs(2.0 * i, engine(healthy=True, unhealthy_s=0.0)) for i in range(10, 16)]
    replay = Replay()
    assert replay.run(series) == [(0.0, "normal", ()), (2.0, "paused", (PAUSE,)), (20.0, "normal", (RESUME,))]
    first = replay.at(2)
    assert first.pause_reason == "vLLM reports engine 0 unhealthy (fault tolerance: vllm:engine_healthy 0)"
    assert first.actions[0].cause is PauseRule.ENGINE_UNHEALTHY
    assert replay.at(18).reason == (
        "paused: vLLM reports engine 0 unhealthy (fault tolerance: vllm:engine_healthy 0) (since 16 s)"
    )


def test_without_fault_tolerance_there_is_no_unhealthy_rule() -> None:
    assert pause_findings(_derived(engine(healthy=None)), S, {}) == []
    assert pause_findings(_derived(engine(healthy=True)), S, {}) == []


def test_the_unhealthy_engine_is_the_leading_reason() -> None:
    both = engine(usage=0.95, healthy=False, unhealthy_s=4.0)
    found = pause_findings(_derived(both), S, {})
    assert [f.rule for f in found] == [PauseRule.ENGINE_UNHEALTHY, PauseRule.KV_CACHE_USAGE]


def test_the_preemption_pause_ends_within_the_short_horizon_of_the_storm_end() -> None:
    """The field report: a 300 s average held /readyz at 503 for 158 s after the load had ended. Judged on the last
    5 polls, the pause ends within 5 polls of the storm's end (and after the min_paused_s dwell)."""
    deriver, window, replay = Deriver(DeriveSettings()), Window(span_s=600), Replay()
    total, rows = 0.0, []
    for i in range(60):
        t = 2.0 * i
        storm = 20 <= i < 50  # 3 preemptions/s for a minute, from 40 s to 100 s
        total += 6.0 if storm else 0.0
        busy = raw.engine(preemptions_total=total, generation_tokens_total=100.0 * i, kv_cache_usage_ratio=0.5)
        window.push(raw.snapshot(t, (busy,)))
        derived = deriver.derive(window)
        observation = Observation(
            now_s=t, wall_time_s=WALL0 + t, poll_ok=True, vllm_healthy=True, data_age_s=0.0, derived=derived
        )
        decision = replay.step(observation)
        if decision.actions:
            rows.append((t, decision.actions[0].kind.value))
    # The storm's last preemptions are read at 98 s; at 106 s only 6 remain in the 10 s horizon (0.6/s): resumed.
    assert rows == [(42.0, PAUSE), (106.0, RESUME)]
    assert replay.at(42).pause_reason == "preemptions 1.20/s > 1.00/s on engine 0"  # 12 in the last 10 s
