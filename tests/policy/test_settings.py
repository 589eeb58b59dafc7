"""PolicySettings: the issue's defaults, validation that names the setting, the cooldown series."""

from __future__ import annotations

import math

import pytest

from sidecar.policy import PolicySettings, PolicySettingsError, stale_after_for_interval


def test_defaults_are_the_issues() -> None:
    s = PolicySettings()
    assert (s.pause_kv_usage_ratio, s.resume_kv_usage_ratio) == (0.90, 0.80)
    assert (s.waiting_ratio, s.waiting_ticks, s.preemptions_per_s, s.min_gpu_free_ratio) == (2.0, 3, 1.0, 0.05)
    assert s.min_paused_s == 10
    assert (s.dead_after_s, s.hung_after_s, s.oom_forecast_s, s.oom_forecast_ticks) == (30, 50, 900, 3)
    # Issue 28: a hang or a vLLM nobody else restarts serving again within 90 s on real vLLM on CPU.
    assert (s.down_after_s, s.down_unsupervised_after_s, s.hung_without_probe_after_s) == (900, 10, 120)
    assert (s.stall_pause_after_s, s.probe_after_s, s.probe_timeout_s) == (10, 20, 20)
    assert s.min_uptime_for_forecast_restart_s == 600
    assert (s.pressure_events_restart, s.pressure_events, s.pressure_window_s) == (False, 3, 300)
    assert (s.max_restarts_per_hour, s.restart_budget_window_s) == (3, 3600)
    assert (s.cooldown_base_s, s.cooldown_max_s) == (60, 3600)
    assert (s.drain_timeout_s, s.startup_timeout_s) == (120, 900)


def test_cooldown_doubles_per_consecutive_restart_up_to_the_max() -> None:
    s = PolicySettings()
    assert [s.cooldown_s(n) for n in range(8)] == [0, 60, 120, 240, 480, 960, 1920, 3600]
    assert s.cooldown_s(10_000) == 3600  # no overflow however long the series


def test_stale_after_is_three_intervals() -> None:
    assert stale_after_for_interval(2.0) == 6.0


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"pause_kv_usage_ratio": 1.5}, "pause_kv_usage_ratio"),
        ({"resume_kv_usage_ratio": 0.0}, "resume_kv_usage_ratio"),
        ({"resume_kv_usage_ratio": 0.9}, "resume_kv_usage_ratio"),  # no hysteresis band: it would flap
        ({"min_gpu_free_ratio": -0.1}, "min_gpu_free_ratio"),
        ({"waiting_ticks": 0}, "waiting_ticks"),
        ({"oom_forecast_ticks": 0}, "oom_forecast_ticks"),
        ({"max_restarts_per_hour": -1}, "max_restarts_per_hour"),
        ({"min_paused_s": -1.0}, "min_paused_s"),
        ({"dead_after_s": 0.0}, "dead_after_s"),
        ({"stale_after_s": 0.0}, "stale_after_s"),
        ({"cooldown_max_s": 30.0}, "cooldown_max_s"),
        ({"hung_after_s": math.inf}, "hung_after_s"),
        ({"waiting_ratio": math.nan}, "waiting_ratio"),
    ],
)
def test_bad_values_name_the_setting(overrides: dict[str, float], named: str) -> None:
    with pytest.raises(PolicySettingsError, match=named):
        PolicySettings(**overrides)  # type: ignore[arg-type]


def test_zero_restarts_per_hour_is_allowed() -> None:
    assert PolicySettings(max_restarts_per_hour=0).max_restarts_per_hour == 0
