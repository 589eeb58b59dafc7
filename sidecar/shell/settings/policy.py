"""The policy's settings: when to pause admission and when to restart. Each is a `PolicySettings` field, whose
default and range are the policy's (see `declare.policy_setting`). No I/O."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from sidecar.shell.settings.declare import PAUSING, POLICY, RESTARTING, policy_setting


class PolicySection(BaseModel):
    """Pausing admission and restarting vLLM: the pure policy's thresholds and budgets."""

    section: ClassVar[str] = "policy"  # its table in a config file

    # --- the policy: pausing ---
    pause_kv_usage: float = policy_setting(
        "pause_kv_usage_ratio",
        "pause at this KV cache usage",
        group=PAUSING,
        note="above --resume-kv-usage",
        why="pause admission when an engine's KV usage reaches this",
    )
    resume_kv_usage: float = policy_setting(
        "resume_kv_usage_ratio",
        "resume at this KV cache usage",
        group=PAUSING,
        note="below --pause-kv-usage",
        why="resume when every engine is at or below this (and the other conditions cleared, after 10 s paused)",
    )
    min_gpu_free: float = policy_setting(
        "min_gpu_free_ratio",
        "pause below this free GPU share",
        group=PAUSING,
        why=(
            "pause when a GPU's free memory falls below this share of its total (unless other processes hold it "
            "with vLLM inside its budget: see [acting.md](acting.md))"
        ),
    )
    pause_alloc_retries: int = policy_setting(
        "pause_alloc_retries",
        "pause at N alloc retries; 0 off",
        group=PAUSING,
        why=(
            "pause admission when PyTorch's allocator in a vLLM process retried this many allocations (freed its "
            "whole cache to fit a tensor), or failed one, over the last 5 polls; resume when 5 polls pass "
            "without; needs `--probe-dir`; 0: never"
        ),
    )
    stall_pause_after: float = policy_setting(
        "stall_pause_after_s",
        "pause after a stall this long",
        group=PAUSING,
        note="a pause this early costs little, the restart waits for --hung-after",
        why=(
            "seconds without engine progress, with requests waiting or running, before admission pauses (until "
            "progress resumes or the restart); also how long the engine probe may wait for its answer before "
            "admission pauses"
        ),
    )
    probe_after: float = policy_setting(
        "probe_after_s",
        "probe an idle stall after; 0 off",
        group=PAUSING,
        why=(
            "seconds without engine progress on an engine that reads idle before the engine probe sends one "
            "1-token completion; an engine with requests and no progress is probed when its stall pauses "
            "admission (`--stall-pause-after`). A fresh vLLM that has generated no token gets a warm-up sized "
            "like a real request instead, never the short probe. `0`: no probe (an engine wedged while idle then "
            "goes unseen)"
        ),
    )
    probe_timeout: float = policy_setting(
        "probe_timeout_s",
        "how long a probe may wait",
        group=PAUSING,
        why=(
            "seconds the probe may wait; no answer in this time proves a wedge only when no counter moved since "
            "it was sent (a probe queued behind a busy engine proves nothing)"
        ),
    )
    # --- the policy: restarting ---
    dead_after: float = policy_setting(
        "dead_after_s",
        "restart if /health fails this long",
        group=RESTARTING,
        why="seconds `/health` may fail, after it was healthy, before vLLM is restarted",
    )
    down_after: float = policy_setting(
        "down_after_s",
        "restart if down, supervised",
        group=RESTARTING,
        note="longer than vLLM takes to load if a supervisor restarts it",
        why=(
            "seconds nothing may listen at vLLM's address while a supervisor may be bringing it back (systemd's "
            "auto-restart or a queued start, the kubelet) before the sidecar restarts it"
        ),
    )
    down_unsupervised_after: float = policy_setting(
        "down_unsupervised_after_s",
        "restart if down, unsupervised",
        group=RESTARTING,
        why=(
            "seconds nothing may listen at vLLM's address when nobody else will start it before the sidecar "
            "restarts it: always with `--actuator exec`; under systemd when the unit is stopped with no job "
            "queued (vLLM exited 0 after its engine died, under `Restart=on-failure`)"
        ),
    )
    hung_after: float = policy_setting(
        "hung_after_s",
        "restart a stall, probe unanswered",
        group=RESTARTING,
        why=(
            "seconds without engine progress before vLLM is restarted, once the engine probe sent meanwhile got "
            "no answer with no counter moving (idle-looking or not): the longest pause of a live engine that is "
            "never restarted"
        ),
    )
    hung_without_probe_after: float = policy_setting(
        "hung_without_probe_after_s",
        "restart a stall, no probe",
        group=RESTARTING,
        why=(
            "where no probe can tell (`--probe-after 0`, or the probe's requests fail): seconds without progress,"
            " with requests waiting or running, before vLLM is restarted"
        ),
    )
    oom_forecast: float = policy_setting(
        "oom_forecast_s",
        "restart at this time to OOM",
        why="planned restart when the forecast time to OOM stays under this for 3 polls",
        group=RESTARTING,
    )
    forecast_min_uptime: float = policy_setting(
        "min_uptime_for_forecast_restart_s",
        "least uptime for a forecast restart",
        group=RESTARTING,
        why="seconds vLLM must have been up before a forecast-driven restart",
    )
    pressure_restarts: bool = policy_setting(
        "pressure_events_restart",
        f"restart on {POLICY.pressure_events} pauses in {POLICY.pressure_window_s / 60:g} min",
        group=RESTARTING,
        why="also restart after 3 pauses in 5 minutes (off: under pure load a restart only loses capacity)",
    )
    max_restarts_per_hour: int = policy_setting(
        "max_restarts_per_hour",
        "automatic restarts per hour",
        group=RESTARTING,
        note="0: none",
        why="automatic restarts allowed in any hour (0: none)",
    )
    drain_timeout: float = policy_setting(
        "drain_timeout_s",
        "wait for requests to finish",
        group=RESTARTING,
        why="seconds to wait for running requests to finish before restarting anyway",
    )
    startup_timeout: float = policy_setting(
        "startup_timeout_s",
        "wait this long for vLLM to start",
        group=RESTARTING,
        why="seconds to wait for vLLM to be healthy after a restart",
    )
