"""The conditions on one tick's derived values, and the one-line reasons they produce."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sidecar.model.derived import Derived, EngineDerived, GpuDerived
from sidecar.policy import PauseRule, PolicySettings, RestartReason
from sidecar.policy.rules import (
    Finding,
    compare,
    hung_cause,
    next_oom_streaks,
    next_waiting_streaks,
    oom_cause,
    pause_findings,
    pressure_findings,
    resume_blockers,
)
from tests.policy.builders import GIB, engine, gpu

S = PolicySettings()


def derived(*engines: EngineDerived, gpus: tuple[GpuDerived, ...] = ()) -> Derived:
    return Derived(engines=engines, gpus=gpus, problems=())


def texts(findings: Sequence[Finding]) -> list[str]:
    return [f.text for f in findings]


def test_kv_usage_at_the_threshold_pauses() -> None:
    found = pause_findings(derived(engine(usage=0.93)), S, {})
    assert texts(found) == ["KV cache usage 0.93 >= 0.90 on engine 0"]
    assert found[0].rule is PauseRule.KV_CACHE_USAGE
    assert texts(pause_findings(derived(engine(usage=0.90)), S, {})) == ["KV cache usage 0.90 >= 0.90 on engine 0"]
    assert pause_findings(derived(engine(usage=0.8999)), S, {}) == []


def test_numbers_never_print_equal_when_they_differ() -> None:
    assert compare(0.8999, 0.90) == ("0.8999", "0.9000")
    assert compare(0.90, 0.90) == ("0.90", "0.90")


def test_waiting_needs_its_streak() -> None:
    d = derived(engine(waiting=9, running=4))
    streaks = next_waiting_streaks({}, d, S)
    assert streaks == {"m/0": 1}
    assert pause_findings(d, S, streaks) == []
    streaks = next_waiting_streaks(next_waiting_streaks(streaks, d, S), d, S)
    assert texts(pause_findings(d, S, streaks)) == ["waiting 9 > 2 x running 4 for 3 ticks on engine 0"]
    # Exactly 2 x running is not more than 2 x running: the streak ends.
    assert next_waiting_streaks(streaks, derived(engine(waiting=8, running=4)), S) == {"m/0": 0}
    # Unknown counts are no evidence.
    assert next_waiting_streaks(streaks, derived(engine(waiting=None)), S) == {"m/0": 0}


def test_preemptions_and_gpu_free_memory() -> None:
    d = derived(engine(preemptions_per_s=1.8), gpus=(gpu(1, free_ratio=0.031),))
    found = pause_findings(d, S, {})
    assert texts(found) == [
        "preemptions 1.80/s > 1.00/s on engine 0",
        "GPU free memory 3.1 % < 5.0 % of total on GPU 1",
    ]
    assert [f.rule for f in found] == [PauseRule.PREEMPTIONS, PauseRule.GPU_FREE_MEMORY]
    assert pause_findings(derived(engine(preemptions_per_s=1.0), gpus=(gpu(free_ratio=0.05),)), S, {}) == []


def _tenant_gpu(*, vllm_gib: float, other_gib: float, unknown_gib: float = 0.0) -> GpuDerived:
    """80 GiB, vLLM's budget 72 GiB (0.9), 2 GiB free (2.5 %): what is held, and by whom, varies."""
    base = gpu(0, free_ratio=2 / 80)
    return dataclasses.replace(
        base,
        vllm_process_memory_bytes=int(vllm_gib * GIB),
        other_process_memory_bytes=int(other_gib * GIB),
        unknown_process_memory_bytes=int(unknown_gib * GIB),
    )


def test_gpu_memory_held_by_another_process_with_vllm_inside_its_budget_is_pressure_not_a_pause() -> None:
    tenant = derived(engine(), gpus=(_tenant_gpu(vllm_gib=71.5, other_gib=6.5),))
    assert pause_findings(tenant, S, {}) == []
    assert resume_blockers(tenant, S) == []
    assert texts(pressure_findings(tenant, S, {}, {})) == [
        "GPU free memory 2.5 % < 5.0 % of total on GPU 0, held by other processes (6.5 GiB) with vLLM inside its "
        "budget: not paused"
    ]
    # vLLM over its own budget: its growth is what a pause can stop.
    grown = derived(engine(), gpus=(_tenant_gpu(vllm_gib=74.0, other_gib=4.0),))
    assert texts(pause_findings(grown, S, {})) == ["GPU free memory 2.5 % < 5.0 % of total on GPU 0"]
    assert pressure_findings(grown, S, {}, {}) == []
    # Memory nobody could be named for may be vLLM's: not known, so the rule pauses as without attribution.
    unknown = derived(engine(), gpus=(_tenant_gpu(vllm_gib=40.0, other_gib=6.5, unknown_gib=31.5),))
    assert [f.rule for f in pause_findings(unknown, S, {})] == [PauseRule.GPU_FREE_MEMORY]
    # No other process: the shortfall is vLLM's own (and NVML's rounding), whatever the budget says.
    alone = derived(engine(), gpus=(_tenant_gpu(vllm_gib=78.0, other_gib=0.0),))
    assert [f.rule for f in pause_findings(alone, S, {})] == [PauseRule.GPU_FREE_MEMORY]


def test_engines_of_several_models_are_named_with_the_model() -> None:
    d = derived(engine(model="a"), engine(model="b", usage=0.95))
    assert texts(pause_findings(d, S, {})) == ["KV cache usage 0.95 >= 0.90 on engine b/0"]


def test_any_engine_pauses_and_every_engine_must_clear() -> None:
    d = derived(engine(name="0", usage=0.2), engine(name="1", usage=0.91))
    assert texts(pause_findings(d, S, {})) == ["KV cache usage 0.91 >= 0.90 on engine 1"]
    d = derived(engine(name="0", usage=0.2), engine(name="1", usage=0.85))
    assert texts(resume_blockers(d, S)) == ["KV cache usage 0.85 > 0.80 resume threshold on engine 1"]
    assert resume_blockers(derived(engine(name="0", usage=0.2), engine(name="1", usage=0.80)), S) == []


def test_missing_values_neither_pause_nor_block_a_resume() -> None:
    d = derived(engine(usage=None, running=None, waiting=None, preemptions_per_s=None, stalled_s=None))
    assert pause_findings(d, S, {"m/0": 5}) == []
    assert resume_blockers(d, S) == []
    assert hung_cause(d, S) is None


def test_resume_blockers_include_every_other_condition() -> None:
    d = derived(engine(usage=0.5, waiting=9, running=4, preemptions_per_s=2.0), gpus=(gpu(free_ratio=0.01),))
    assert texts(resume_blockers(d, S)) == [
        "waiting 9 > 2 x running 4 on engine 0",
        "preemptions 2.00/s > 1.00/s on engine 0",
        "GPU free memory 1.0 % < 5.0 % of total on GPU 0",
    ]


def test_pressure_is_a_condition_partly_met() -> None:
    d = derived(engine(usage=0.85, waiting=9, running=4, stalled_s=6), gpus=(gpu(time_to_oom_s=412),))
    found = pressure_findings(d, S, {"m/0": 1}, {0: 2})
    assert texts(found) == [
        "KV cache usage 0.85 above 0.80 on engine 0",
        "waiting > 2 x running for 1 of 3 ticks on engine 0",
        "engine 0 made no progress for 6 s with 4 requests running and 9 waiting",
        "forecast time to OOM 412 s < 900 s on GPU 0",
    ]
    assert pressure_findings(derived(engine(usage=0.80)), S, {}, {}) == []
    # At the pause threshold it is no longer pressure but a pause (the caller pauses).
    assert pressure_findings(derived(engine(usage=0.90)), S, {}, {}) == []


def test_a_stalled_engine_pauses_admission_long_before_it_counts_as_hung() -> None:
    stalled = derived(engine(stalled_s=10, running=4))
    line = "engine 0 made no progress for 10 s >= 10 s with 4 requests running"
    assert texts(pause_findings(stalled, S, {})) == [line]
    assert pause_findings(stalled, S, {})[0].rule is PauseRule.ENGINE_STALLED
    assert pressure_findings(stalled, S, {}, {}) == []  # a pause now, no longer pressure
    assert texts(pressure_findings(derived(engine(stalled_s=9, running=4)), S, {}, {})) == [
        "engine 0 made no progress for 9 s with 4 requests running"
    ]
    assert pause_findings(derived(engine(stalled_s=9, running=4)), S, {}) == []
    # Idle is never stalled (the tracker counts a stall only with work: sidecar.derive.progress).
    assert pause_findings(derived(engine(stalled_s=0, running=0, waiting=0)), S, {}) == []
    # A scheduler that admits nothing: requests waiting, none running, nothing moving.
    assert texts(pause_findings(derived(engine(stalled_s=10, running=0, waiting=3)), S, {})) == [
        "engine 0 made no progress for 10 s >= 10 s with 3 requests waiting and none running"
    ]
    # Metrics frozen at idle while requests are in flight at the API server (vLLM's /load).
    assert texts(pause_findings(derived(engine(stalled_s=10, running=0, waiting=0)), S, {})) == [
        "engine 0 made no progress for 10 s >= 10 s with requests in flight at vLLM's API server while its "
        "engine reads idle"
    ]
    # Progress again: nothing holds the pause (the dwell time aside).
    assert resume_blockers(derived(engine(stalled_s=0, running=4)), S) == []
    assert texts(resume_blockers(stalled, S)) == [line]
    # Set at or past --hung-after, the restart comes first and there is no pressure stage of its own.
    late = PolicySettings(stall_pause_after_s=200.0)
    assert pause_findings(derived(engine(stalled_s=150, running=4)), late, {}) == []
    assert pressure_findings(derived(engine(stalled_s=150, running=4)), late, {}, {}) == []


def test_hung_on_the_stall_alone_where_no_probe_can_tell() -> None:
    cause = hung_cause(derived(engine(stalled_s=130, running=4)), S)
    assert cause is not None
    assert cause.reason is RestartReason.ENGINE_HUNG
    assert cause.text == "engine 0 made no progress for 130 s >= 120 s with 4 requests running (hung)"
    assert hung_cause(derived(engine(stalled_s=119, running=4)), S) is None
    assert hung_cause(derived(engine(stalled_s=0, running=0, waiting=0)), S) is None
    waiting_only = hung_cause(derived(engine(stalled_s=130, running=0, waiting=2)), S)
    assert waiting_only is not None
    assert waiting_only.text.endswith("with 2 requests waiting and none running (hung)")


def test_where_the_probe_tells_a_stall_alone_is_not_hung_but_a_proven_wedge_is_even_reading_idle() -> None:
    stalled = derived(engine(stalled_s=130, running=4, quiet_s=130))
    assert hung_cause(stalled, S, stall_alone=False) is None  # the probe decides
    wedge = "a 1-token probe completion got no answer in 60 s"
    cause = hung_cause(stalled, S, wedge=wedge, stall_alone=False)
    assert cause is not None
    assert cause.text == f"engine 0 made no progress for 130 s >= 50 s, and {wedge} (hung)"
    idle_looking = derived(engine(stalled_s=0, running=0, waiting=0, quiet_s=125))
    idle_cause = hung_cause(idle_looking, S, wedge=wedge, stall_alone=False)
    assert idle_cause is not None
    assert idle_cause.text.startswith("engine 0 made no progress for 125 s >= 50 s, and a 1-token probe")
    assert hung_cause(derived(engine(quiet_s=48)), S, wedge=wedge, stall_alone=False) is None  # not yet


def test_oom_forecast_needs_three_ticks_under_the_limit() -> None:
    d = derived(gpus=(gpu(0), gpu(1, time_to_oom_s=412)))
    streaks = next_oom_streaks({}, d, S)
    assert streaks == {0: 0, 1: 1}
    assert oom_cause(d, S, streaks) is None
    streaks = next_oom_streaks(next_oom_streaks(streaks, d, S), d, S)
    cause = oom_cause(d, S, streaks)
    assert cause is not None
    assert cause.text == "forecast time to OOM 412 s < 900 s for 3 ticks on GPU 1"
    # 900 s exactly is not under 900 s; no forecast (memory not growing) ends the streak too.
    assert next_oom_streaks(streaks, derived(gpus=(gpu(1, time_to_oom_s=900),)), S) == {1: 0}
    assert next_oom_streaks(streaks, derived(gpus=(gpu(1),)), S) == {1: 0}


class TestDownIsNotDead:
    """A vLLM whose process is gone (connection refused) is being reloaded by its supervisor; only a long
    silence with nothing listening makes the sidecar restart it."""

    def _run(self, *, down_for_s: float, down_after_s: float = 900.0) -> list[str]:
        from sidecar.model.derived import Derived
        from sidecar.policy.decision import ActionKind
        from sidecar.policy.ledger import RestartLedger
        from sidecar.policy.machine import Policy
        from sidecar.policy.observation import Observation
        from sidecar.policy.settings import PolicySettings

        policy = Policy(PolicySettings(down_after_s=down_after_s))
        ledger = RestartLedger()
        empty = Derived(engines=(), gpus=(), problems=())
        kinds: list[str] = []
        t = 0.0
        for _ in range(3):  # healthy and polled: the startup grace ends
            policy.decide(
                Observation(
                    now_s=t, wall_time_s=1e9 + t, poll_ok=True, vllm_healthy=True, data_age_s=0.0, derived=empty
                ),
                ledger,
            )
            t += 2.0
        start = t
        while t - start <= down_for_s:
            decision = policy.decide(
                Observation(
                    now_s=t,
                    wall_time_s=1e9 + t,
                    poll_ok=False,
                    vllm_healthy=False,
                    data_age_s=t - start,
                    derived=empty,
                    vllm_down=True,
                ),
                ledger,
            )
            kinds += [str(action.kind) for action in decision.actions]
            if ActionKind.RESTART in [a.kind for a in decision.actions] or kinds:
                break
            t += 2.0
        return kinds

    def test_a_supervisor_reloading_vllm_for_ten_minutes_is_left_alone(self) -> None:
        assert self._run(down_for_s=600.0) == []

    def test_nothing_listening_past_down_after_restarts_it(self) -> None:
        kinds = self._run(down_for_s=1000.0)
        assert "drain" in kinds or "restart" in kinds

    def test_an_engine_failing_inside_a_live_server_is_dead_after_30_s(self) -> None:
        from sidecar.model.derived import Derived
        from sidecar.policy.ledger import RestartLedger
        from sidecar.policy.machine import Policy
        from sidecar.policy.observation import Observation

        policy, ledger = Policy(), RestartLedger()
        empty = Derived(engines=(), gpus=(), problems=())
        t, kinds = 0.0, []
        for _ in range(3):
            policy.decide(
                Observation(
                    now_s=t, wall_time_s=1e9 + t, poll_ok=True, vllm_healthy=True, data_age_s=0.0, derived=empty
                ),
                ledger,
            )
            t += 2.0
        for _ in range(20):  # /health answers 503 while /metrics still reads: engine dead in a live server
            decision = policy.decide(
                Observation(
                    now_s=t, wall_time_s=1e9 + t, poll_ok=True, vllm_healthy=False, data_age_s=0.0, derived=empty
                ),
                ledger,
            )
            kinds += [str(action.kind) for action in decision.actions]
            t += 2.0
        assert "drain" in kinds or "restart" in kinds
