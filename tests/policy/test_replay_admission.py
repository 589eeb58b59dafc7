"""Replays of admission control: recorded series through the Policy, against golden (t, state, actions).

Each golden is written out by hand from the issue's rules, not computed from the code. A row appears for
every step whose state changed or that took an action; the series tick every 2 s unless said otherwise.
"""

from __future__ import annotations

from sidecar.policy import (
    Observation,
    PolicySettings,
)
from tests.policy.builders import Replay, down, engine, gpu, obs, ticks

PAUSE, RESUME, DRAIN = "pause_admission", "resume_admission", "drain"


def kv_series(usages: list[float]) -> list[Observation]:
    return [obs(2.0 * i, engine(usage=u)) for i, u in enumerate(usages)]


def test_kv_jitter_between_the_thresholds_never_flaps() -> None:
    usages = [0.50, 0.70, 0.82, 0.88, 0.84, 0.89, 0.81, 0.90, 0.86, 0.92, 0.89, 0.83, 0.81, 0.85]
    usages += [0.80, 0.84, 0.89, 0.86, 0.79, 0.60]
    assert Replay().run(kv_series(usages)) == [
        (0.0, "normal", ()),
        (4.0, "pressure", ()),  # 0.82: inside the band, admission open
        (14.0, "paused", (PAUSE,)),  # 0.90 reached
        (28.0, "normal", (RESUME,)),  # first value <= 0.80, paused 14 s
        (30.0, "pressure", ()),
        (36.0, "normal", ()),
    ]


def test_resume_waits_for_the_dwell_time() -> None:
    replay = Replay()
    assert replay.run(kv_series([0.5] * 5 + [0.95] + [0.3] * 8)) == [
        (0.0, "normal", ()),
        (10.0, "paused", (PAUSE,)),
        (20.0, "normal", (RESUME,)),  # clear since 12 s, but paused only 10 s at 20 s
    ]
    assert replay.at(18).reason == (
        "holding the pause: paused 8 s of at least 10 s; "
        "held by KV cache usage 0.95 >= 0.90 on engine 0 for 2 s, clear for 6 s"
    )
    assert replay.at(20).reason == (
        "resumed, all clear after 10 s paused: KV cache usage 0.30 <= 0.80 on every engine, no pause condition "
        "holds; held by KV cache usage 0.95 >= 0.90 on engine 0 for 2 s, clear for 8 s"
    )


def test_waiting_queue_two_ticks_then_three() -> None:
    waiting = [0, 9, 9, 2, 9, 9, 10, 9, 3, 3, 3, 3]
    series = [obs(2.0 * i, engine(waiting=w, running=4)) for i, w in enumerate(waiting)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (2.0, "pressure", ()),  # 1 of 3 ticks
        (6.0, "normal", ()),  # 2 <= 2 x 4: the streak ends at 2
        (8.0, "pressure", ()),
        (12.0, "paused", (PAUSE,)),  # third consecutive tick
        (22.0, "normal", (RESUME,)),  # clear from 16 s, paused 10 s at 22 s
    ]
    assert replay.at(12).actions[0].reason == "waiting 10 > 2 x running 4 for 3 ticks on engine 0"


def test_one_engine_pauses_the_pod_and_all_must_clear_to_resume() -> None:
    pairs = [(0.5, 0.5), (0.5, 0.93)] + [(0.85, 0.5)] * 6 + [(0.7, 0.5)]
    series = [obs(2.0 * i, engine(name="0", usage=a), engine(name="1", usage=b)) for i, (a, b) in enumerate(pairs)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (2.0, "paused", (PAUSE,)),
        (16.0, "normal", (RESUME,)),  # engine 1 cleared at 4 s, engine 0 only at 16 s
    ]
    assert replay.at(2).pause_reason == "KV cache usage 0.93 >= 0.90 on engine 1"
    # KV usage has held the pause since it began (engine 1's, then engine 0's): the hold says how long.
    assert replay.at(14).reason == (
        "holding the pause: KV cache usage 0.85 > 0.80 resume threshold on engine 0 (since 12 s)"
    )
    assert replay.at(16).actions[0].reason == (
        "resumed, all clear after 14 s paused: KV cache usage 0.70 <= 0.80 on every engine, no pause condition "
        "holds; held by KV cache usage 0.85 > 0.80 resume threshold on engine 0 for 14 s, clear for 0 s"
    )


def test_preemption_rate_spike() -> None:
    rates = [0.0, 0.5, 3.2, 2.0, 0.8, 0.1, 0.0, 0.0, 0.0]
    series = [obs(2.0 * i, engine(preemptions_per_s=r)) for i, r in enumerate(rates)]
    assert Replay().run(series) == [
        (0.0, "normal", ()),
        (4.0, "paused", (PAUSE,)),
        (14.0, "normal", (RESUME,)),
    ]


def test_gpu_free_memory_dipping() -> None:
    free = [0.2, 0.08, 0.049, 0.03, 0.06, 0.07, 0.2, 0.2, 0.2]
    series = [obs(2.0 * i, gpus=(gpu(0), gpu(1, free_ratio=f))) for i, f in enumerate(free)]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (4.0, "paused", (PAUSE,)),
        (14.0, "normal", (RESUME,)),
    ]
    assert replay.at(4).pause_reason == "GPU free memory 4.9 % < 5.0 % of total on GPU 1"


def test_stale_data_mid_pause_holds_and_never_resumes() -> None:
    series = [obs(0, engine(usage=0.5)), obs(2, engine(usage=0.95)), obs(4, engine(usage=0.5))]
    series += [down(t, since_poll_s=t - 4, health=True) for t in ticks(6, 30)]  # /metrics times out
    series += [obs(32, engine(usage=0.5))]
    replay = Replay()
    assert replay.run(series) == [
        (0.0, "normal", ()),
        (2.0, "paused", (PAUSE,)),
        (32.0, "normal", (RESUME,)),  # the old values were clear from 12 s, but they were stale
    ]
    assert replay.at(12).reason == "holding, no fresh data (last poll 8 s ago, stale after 6 s); admission stays paused"


def test_stale_data_breaks_a_streak() -> None:
    series = [obs(0)] + [obs(t, engine(waiting=9, running=4)) for t in (2, 4)]
    series += [down(t, since_poll_s=t - 4, health=True) for t in ticks(6, 12)]
    series += [obs(t, engine(waiting=9, running=4)) for t in ticks(14, 18)]
    assert Replay().run(series) == [
        (0.0, "normal", ()),
        (2.0, "pressure", ()),
        (12.0, "normal", ()),  # stale: the streak of 2 is forgotten, not continued
        (14.0, "pressure", ()),
        (18.0, "paused", (PAUSE,)),  # three fresh ticks again
    ]


def test_startup_grace_however_long_loading_takes() -> None:
    series = [obs(t, healthy=False, poll_ok=False, age_s=None) for t in ticks(0, 1990, 10)]
    series += [obs(2000, engine(usage=0.95))]
    replay = Replay()
    assert replay.run(series) == [(2000.0, "paused", (PAUSE,))]
    assert replay.at(0).reason == (
        "startup grace, no action until vLLM has been healthy and polled once (healthy: no, polled: no)"
    )


def test_pressure_events_rule_is_off_by_default_and_restarts_when_on() -> None:
    usages = [0.5, 0.95, 0.5, 0.5, 0.5, 0.5, 0.5, 0.95, 0.5, 0.5, 0.5, 0.5, 0.5, 0.95]
    on = PolicySettings(pressure_events_restart=True)
    assert Replay(on).run(kv_series(usages)) == [
        (0.0, "normal", ()),
        (2.0, "paused", (PAUSE,)),
        (12.0, "normal", (RESUME,)),
        (14.0, "paused", (PAUSE,)),
        (24.0, "normal", (RESUME,)),
        (26.0, "draining", (PAUSE, DRAIN)),  # the third automatic pause within 300 s
    ]
    assert Replay().run(kv_series(usages))[-1] == (26.0, "paused", (PAUSE,))


def test_a_hold_and_the_resume_name_the_condition_that_held_the_pause_and_since_when() -> None:
    # KV usage pauses; the storm of preemptions outlasts it; the resume says it was the preemptions.
    steps = [(0.95, 0.0), (0.5, 2.0), (0.5, 2.0), (0.5, 2.0), (0.5, 0.0), (0.5, 0.0), (0.5, 0.0)]
    series = [obs(2.0 * i, engine(usage=u, preemptions_per_s=r)) for i, (u, r) in enumerate(steps)]
    replay = Replay()
    assert replay.run(series) == [(0.0, "paused", (PAUSE,)), (10.0, "normal", (RESUME,))]
    # Still a pause condition itself: the pause's reason (and the /readyz body) says since when.
    assert replay.at(6).reason == "paused: preemptions 2.00/s > 1.00/s on engine 0 (since 4 s)"
    assert replay.at(6).pause_reason == "preemptions 2.00/s > 1.00/s on engine 0 (since 4 s)"
    assert (
        replay.at(10)
        .actions[0]
        .reason.endswith(
            "no pause condition holds; held by preemptions 2.00/s > 1.00/s on engine 0 for 6 s, clear for 2 s"
        )
    )
