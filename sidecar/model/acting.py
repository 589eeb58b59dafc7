"""What the exporter shows of acting: the policy's state, counters and the restart ledger. Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.model.cause import CrashCause
from sidecar.model.incident import IncidentRef
from sidecar.model.remediation import Allowance, Step
from sidecar.model.status import RecentDecision


@dataclass(frozen=True, slots=True, kw_only=True)
class RemediationView:
    """--remediate: what may change, what the flags file holds, the recent steps and their outcomes."""

    allowed: tuple[Allowance, ...]
    flags_file: str
    flags: dict[str, float]  # what vLLM's next start gets from the sidecar
    steps: tuple[Step, ...]  # the newest, oldest first
    outcomes: dict[tuple[str, str], int]  # (flag, outcome) -> count since the sidecar started
    last_refusal: str | None
    problem: str | None  # why the record or the log cannot be used, when one cannot


@dataclass(frozen=True, slots=True, kw_only=True)
class ActingView:
    state: str
    states: tuple[str, ...]  # every state the policy has, for the 0/1 series of vllm_sidecar_policy_state
    admission_paused: bool  # the policy pauses admission (never in dry-run)
    ready: bool  # /readyz answers 200: vLLM seen healthy lately and admission not paused
    readiness_reason: str
    decision_reason: str
    would_restart_but: str | None
    cooldown_remaining_s: float | None
    restarts_in_budget_window: int
    restart_budget_remaining: int
    last_restart_wall_time_s: float | None
    dry_run: bool
    actuator: str
    actions: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    recent: tuple[RecentDecision, ...] = ()
    # Every label value the counters can take. Exported at 0 before the first event: Prometheus' increase()
    # cannot see a series that is born at 1, so an alert on the first restart would never fire.
    action_kinds: tuple[str, ...] = ()
    failure_kinds: tuple[str, ...] = ()
    restart_reasons: tuple[str, ...] = ()
    # The engine probe: answers by outcome (every outcome exported from 0), and the last one.
    probes: dict[str, int] = field(default_factory=dict)
    probe_outcomes: tuple[str, ...] = ()
    last_probe: str | None = None  # "<outcome>: <what came back>"
    last_probe_duration_s: float | None = None
    crash_cause: CrashCause | None = None  # the last cause of a death read from vLLM's log, or why it is unknown
    last_incident: IncidentRef | None = None  # the last incident folder written
    incidents: dict[str, int] = field(default_factory=dict)  # incident folders written, by trigger
    incident_triggers: tuple[str, ...] = ()
    incident_parts_missing: dict[str, int] = field(default_factory=dict)  # by kind
    incident_kinds: tuple[str, ...] = ()
    remediation: RemediationView | None = None  # None: --remediate is off
