"""The policy: a pure state machine that turns each tick's derived values into a decision. No I/O.

The shell feeds `Policy.decide` one `Observation` per tick, reports what the restart adapter did through
`Policy.procedure_event`, and forwards the admin API through `Policy.manual`; it performs the actions of the
`Decision` it gets back (or, with --dry-run, only logs them as "would do") and persists the `RestartLedger`.
"""

from sidecar.policy.decision import (
    Action,
    ActionKind,
    Decision,
    ManualAction,
    PauseRule,
    PolicyState,
    ProcedureEvent,
    RestartReason,
)
from sidecar.policy.ledger import RestartLedger, RestartLedgerError, RestartRecord
from sidecar.policy.machine import Policy
from sidecar.policy.observation import Observation
from sidecar.policy.settings import PolicySettings, PolicySettingsError, stale_after_for_interval

__all__ = [
    "Action",
    "ActionKind",
    "Decision",
    "ManualAction",
    "Observation",
    "PauseRule",
    "Policy",
    "PolicySettings",
    "PolicySettingsError",
    "PolicyState",
    "ProcedureEvent",
    "RestartLedger",
    "RestartLedgerError",
    "RestartReason",
    "RestartRecord",
    "stale_after_for_interval",
]
