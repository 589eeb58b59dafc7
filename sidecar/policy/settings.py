"""Every threshold of the policy, with its unit in its name, validated at construction. Pure.

The defaults are the issue's, and this is the one place each default and range is written: the daemon's flags
take both from here (`sidecar/shell/settings/policy.py`, the ranges through `sidecar.bounds`), and the alert rules' and
the dashboard's generators take the defaults (`alerts/generate.py`, `grafana/generate.py`);
tests/alerts/test_threshold_drift.py fails when a shipped file shows another number. The shell builds one
`PolicySettings` from the command line and passes it to `Policy`; nothing here reads the environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from sidecar.bounds import Annotated, Ge, Gt, Le, first_violation


class PolicySettingsError(ValueError):
    """A policy setting out of range; the message names the setting and what it accepts."""


def stale_after_for_interval(interval_s: float) -> float:
    """The staleness limit the shell should pass for a poll interval: three missed polls make data stale.

    One or two missed polls are ordinary (a slow scrape, a GC pause) and must not freeze the policy; by the
    third the values no longer describe the engine.
    """
    return 3.0 * interval_s


# Each field's range is on its type: `__post_init__` checks it, and the daemon's flags, their help and their
# error lines read it from here (`sidecar.bounds`), so it is written once.
Ratio = Annotated[float, Gt(0), Le(1)]
Seconds = Annotated[float, Gt(0)]
NonNegative = Annotated[float, Ge(0)]  # 0 switches the rule off, or allows no slack
Count = Annotated[int, Ge(0)]
AtLeastOne = Annotated[int, Ge(1)]
RestartsPerHour = Annotated[int, Ge(0), Le(60)]  # more than one a minute is a crash loop, not a policy


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    # Pausing admission (/readyz 503). Any engine or GPU meeting one condition pauses: the pod is one unit.
    pause_kv_usage_ratio: Ratio = 0.90  # pause when an engine's KV usage is at or above this
    resume_kv_usage_ratio: Ratio = 0.80  # resume only when every engine is at or below this (hysteresis)
    waiting_ratio: NonNegative = 2.0  # pause when waiting > this x running ...
    waiting_ticks: AtLeastOne = 3  # ... on this many consecutive polls
    preemptions_per_s: NonNegative = 1.0  # pause when an engine preempts more than this per second
    min_gpu_free_ratio: Ratio = 0.05  # pause when a GPU's free memory is below this share of its total
    # Pause when PyTorch's allocator in a vLLM process retried this many allocations (or failed one) over the
    # short horizon (allocator probe): it freed its whole cache to find room, the step before an OOM. 0: never.
    pause_alloc_retries: Count = 1
    # Pause when an engine made no progress this long with requests running: new requests would only queue
    # behind it, while other replicas serve them. Short: a wrong pause costs a few seconds out of rotation.
    stall_pause_after_s: Seconds = 10.0
    min_paused_s: NonNegative = 10.0  # an automatic pause lasts at least this long (dwell time)
    # Restarting vLLM (drain first).
    dead_after_s: Seconds = 30.0  # /health failing this long, after vLLM had been healthy: engine dead
    # Nothing listening this long while a supervisor may be bringing vLLM back (systemd's auto-restart, the
    # kubelet, a process loading): restart it. Shorter would restart a vLLM its supervisor is reloading.
    down_after_s: Seconds = 900.0
    # Nothing listening this long and nobody else will start it (the exec adapter; a systemd unit stopped with
    # no job queued, as after vLLM exits 0 under Restart=on-failure): the sidecar is the supervisor, restart it.
    down_unsupervised_after_s: Seconds = 10.0
    # No progress this long, and a probe sent meanwhile got no answer with nothing moving: engine hung. The
    # longest pause of a live engine that is never restarted; short enough that a hang serves again in 90 s.
    hung_after_s: Seconds = 50.0
    # Where no probe can tell (probes off, or their answers say nothing): a stall with work this long is a hang.
    hung_without_probe_after_s: Seconds = 120.0
    # The engine probe (see `probe`): one 1-token completion once a stall with work reaches
    # stall_pause_after_s, and after this long without progress on an engine that reads idle (0: never; the
    # hung rule then judges the stall alone, and an engine wedged while idle goes unseen) ...
    probe_after_s: NonNegative = 20.0
    # ... and how long it may wait: its silence proves a wedge only when nothing else moved meanwhile, so a
    # queue the probe waits in (a busy engine) is never taken for one.
    probe_timeout_s: Seconds = 20.0
    oom_forecast_s: Seconds = 900.0  # forecast time to OOM under this ...
    oom_forecast_ticks: AtLeastOne = 3  # ... on this many consecutive polls: restart before it crashes
    min_uptime_for_forecast_restart_s: NonNegative = 600.0  # a forecast from a young vLLM is not trusted yet
    pressure_events_restart: bool = False  # the classic rule, off by default
    pressure_events: AtLeastOne = 3  # automatic pauses ...
    pressure_window_s: Seconds = 300.0  # ... within this window restart vLLM (when enabled)
    # Guards.
    max_restarts_per_hour: RestartsPerHour = 3  # automatic restarts in any hour; 0 disables automatic restarts
    restart_budget_window_s: Seconds = 3600.0  # the "hour" of the budget
    cooldown_base_s: Seconds = 60.0  # no automatic restart this long after vLLM came back ...
    cooldown_max_s: Seconds = 3600.0  # ... doubling per consecutive restart, up to this
    cooldown_reset_s: Seconds = 3600.0  # a restart this long after the previous one starts a new series
    drain_timeout_s: Seconds = 120.0  # wait at most this long for running requests to reach 0
    startup_timeout_s: Seconds = 900.0  # wait at most this long for vLLM to be healthy after a restart
    stale_after_s: Seconds = 6.0  # data older than this is stale: hold (3 x the default 2 s interval)

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float | int) and not isinstance(value, bool) and not math.isfinite(value):
                raise PolicySettingsError(f"{field.name} must be a finite number, got {value!r}")
        violation = first_violation(self)
        if violation is not None:
            raise PolicySettingsError(violation)
        if self.resume_kv_usage_ratio >= self.pause_kv_usage_ratio:
            raise PolicySettingsError(
                f"resume_kv_usage_ratio ({self.resume_kv_usage_ratio}) must be below pause_kv_usage_ratio "
                f"({self.pause_kv_usage_ratio}), otherwise admission flaps around one value"
            )
        if self.cooldown_max_s < self.cooldown_base_s:
            raise PolicySettingsError(
                f"cooldown_max_s ({self.cooldown_max_s}) must be at least cooldown_base_s ({self.cooldown_base_s})"
            )

    def cooldown_s(self, consecutive: int) -> float:
        """Cooldown after the `consecutive`-th restart of a series: base, 2 x base, 4 x base ... up to the max."""
        if consecutive <= 0:
            return 0.0
        # Cap the exponent: 2**64 x base is far past any max, and a huge power would overflow the float.
        return min(self.cooldown_base_s * 2.0 ** min(consecutive - 1, 64), self.cooldown_max_s)
