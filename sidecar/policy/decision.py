"""What the policy answers: its state, the actions to take, and why. Pure data.

Every enum value is a bounded label for /metrics (`state`, `action`, `reason`) and a key in notifications.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PolicyState(StrEnum):
    STARTING = "starting"  # startup grace: vLLM not yet healthy and polled once since the sidecar started
    NORMAL = "normal"
    PRESSURE = "pressure"  # a pause or restart condition is partly met (see `rules`); nothing is done yet
    DOWN = "down"  # vLLM gone (nothing listens) or its engine dead, outside a restart: waiting for its restarter
    PAUSED = "paused"  # admission paused (/readyz 503), automatically or by hand
    DRAINING = "draining"  # admission paused, waiting for running requests to reach 0 before a restart
    RESTARTING = "restarting"  # restart asked of the adapter; waiting for it, then for /health and a poll
    COOLDOWN = "cooldown"  # vLLM came back from a restart; automatic restarts wait until the cooldown ends
    FAILED = "failed"  # a restart failed; automatic restarts are off until a manual action (or recovery)


class ActionKind(StrEnum):
    PAUSE_ADMISSION = "pause_admission"  # /readyz answers 503
    RESUME_ADMISSION = "resume_admission"  # /readyz answers 200
    DRAIN = "drain"  # a restart begins: admission is paused, running requests are left to finish
    RESTART = "restart"  # call the restart adapter; report its outcome with `Policy.procedure_event`
    NOTIFY_RESTART_DONE = "notify_restart_done"  # vLLM is healthy again after a restart
    NOTIFY_RESTART_FAILED = "notify_restart_failed"  # a step of the restart failed; the reason says which
    NOTIFY_BUDGET_EXHAUSTED = "notify_budget_exhausted"  # a restart was due but the hourly budget is spent
    NOTIFY_VLLM_RECOVERED = "notify_vllm_recovered"  # vLLM died or was gone, and is back without our restart
    PROBE_ENGINE = "probe_engine"  # send one 1-token completion; report its answer with `Policy.probe_event`
    # The probe of a fresh vLLM that has generated no token: a 1-token completion whose prompt is sized like a
    # real request's, so the sidecar's short probe is never a vLLM's first request; reported like a probe.
    WARM_UP_ENGINE = "warm_up_engine"


class RestartReason(StrEnum):
    ENGINE_DEAD = "engine_dead"
    ENGINE_HUNG = "engine_hung"
    OOM_FORECAST = "oom_forecast"
    PRESSURE_EVENTS = "pressure_events"
    MANUAL = "manual"
    FLAGS_CHANGED = "flags_changed"  # the sidecar changed a flag of vLLM's next start (--remediate)


class PauseRule(StrEnum):
    KV_CACHE_USAGE = "kv_cache_usage"
    WAITING_QUEUE = "waiting_queue"
    PREEMPTIONS = "preemptions"
    GPU_FREE_MEMORY = "gpu_free_memory"
    ENGINE_STALLED = "engine_stalled"
    ENGINE_UNHEALTHY = "engine_unhealthy"  # vLLM's fault tolerance reports the engine unhealthy (engine_healthy 0)
    ALLOCATOR_RETRIES = "allocator_retries"  # PyTorch's allocator had to flush its cache to fit (allocator probe)
    MANUAL = "manual"


class Guard(StrEnum):
    """Which guard refuses a restart that is due: a stable key, so a blocked restart is reported once."""

    FAILED_RESTART = "failed_restart"  # automatic restarts are off after a failed restart
    DISABLED = "disabled"  # max_restarts_per_hour = 0
    BUDGET = "budget"  # the hourly restart budget is spent
    COOLDOWN = "cooldown"  # too soon after the last restart
    PLATFORM_REFUSED = "platform_refused"  # the platform said "not now" (a PodDisruptionBudget); backing off
    MIN_UPTIME = "min_uptime"  # vLLM not up long enough to trust a forecast


class ProcedureEvent(StrEnum):
    """Steps of the drain-and-restart procedure, reported by the shell (or seen by `decide` on a tick)."""

    DRAINED = "drained"  # vLLM reports 0 running on every engine
    DRAIN_TIMED_OUT = "drain_timed_out"  # still running after drain_timeout_s: restart anyway
    RESTART_ACCEPTED = "restart_accepted"  # the adapter did (or, on Kubernetes, accepted) the restart
    RESTART_FAILED = "restart_failed"  # the adapter failed or refused (403, no such unit, job failed, timeout)
    RESTART_NOT_NOW = "restart_not_now"  # the platform said "later" (a PodDisruptionBudget's 429)
    HEALTHY_AGAIN = "healthy_again"  # /health 200 and a successful poll after the restart
    STARTUP_TIMED_OUT = "startup_timed_out"  # not healthy startup_timeout_s after the restart


class ManualAction(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    RESTART = "restart"


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    reason: str  # one line with the numbers; with --dry-run the shell logs "would <kind>: <reason>"
    cause: PauseRule | RestartReason | None = None  # machine-friendly, e.g. for a notification's reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    state: PolicyState
    previous_state: PolicyState  # the state of the decision before this one: log when they differ
    admission_paused: bool  # what /readyz should say from now on
    pause_reason: str | None  # why admission is paused (the /readyz 503 body); None while admitting
    actions: tuple[Action, ...]  # in the order to perform them; empty on most ticks
    reason: str  # one line for the log and /status: what was decided and why, with the numbers
    would_restart_but: str | None  # a restart condition holds, but this guard blocks it (one line)
    blocked_by: Guard | None  # which guard that is (a stable key: its line carries numbers that change)
    restart_reason: RestartReason | None  # of the restart in progress, blocked, or just failed
    cooldown_remaining_s: float | None  # until automatic restarts are allowed again after the last one
    restarts_in_budget_window: int  # restarts in the last restart_budget_window_s (manual ones included)
    manual_pause: bool  # admission held by a manual pause, lifted only by a manual resume
    now_s: float
    wall_time_s: float
