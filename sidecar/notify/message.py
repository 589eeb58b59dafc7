"""A notification: what happened, why, when. Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sidecar.model.cause import CrashCause


class NotificationKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    RESTART_BEGIN = "restart_begin"
    RESTART_END = "restart_end"
    RESTART_FAILURE = "restart_failure"
    BUDGET_EXHAUSTED = "budget_exhausted"
    VLLM_RECOVERED = "vllm_recovered"  # vLLM died (or was gone) and came back without the sidecar restarting it
    REMEDIATION = "remediation"  # a flag of vLLM's next start set, confirmed, reverted or refused (--remediate)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    kind: NotificationKind
    summary: str  # one line a person reads first, e.g. "admission paused: KV cache usage 0.93 >= 0.90"
    reason: str  # machine-friendly cause, e.g. "kv_cache_usage" or "oom_forecast"
    wall_time_s: float
    dry_run: bool = False
    details: dict[str, str] = field(default_factory=dict)  # never secrets; values already formatted
    # Why vLLM died, from its own log (restart_begin for a dead engine, restart_end, vllm_recovered); None
    # for the other kinds, and until the explain step has read the log.
    cause: CrashCause | None = None
    # The incident folder kept for it (restart_end, restart_failure, vllm_recovered; docs/incidents.md), or None.
    incident: str | None = None
