"""What every restart adapter offers the shell, and what it reports back. No I/O here.

An adapter is thin: it performs one restart the way its platform does it and reports what happened in one
`ActuatorOutcome`; it never retries on its own (the policy decides whether and when to try again) and,
with `dry_run`, only says what it would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sidecar.model.supervision import Supervision


class OutcomeStatus(StrEnum):
    DONE = "done"  # the platform accepted and completed (or, for Kubernetes, accepted) the restart
    NOT_NOW = "not_now"  # refused for now, try later (a PodDisruptionBudget's 429)
    FAILED = "failed"  # refused or failed; `detail` says why (RBAC 403, no such unit, job failed, timeout)
    DRY_RUN = "dry_run"  # nothing was done; `detail` says what would have been


@dataclass(frozen=True, slots=True, kw_only=True)
class ActuatorOutcome:
    status: OutcomeStatus
    detail: str  # one line, for logs, notifications and /status
    duration_s: float


class Actuator(Protocol):
    name: str  # "systemd", "kubernetes", "exec", "none"

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        """One restart. `hard`: the engine is dead or hung, nothing of it will finish: an adapter that can end
        every process of vLLM at once (SIGKILL) before starting it does so, rather than wait for a stop that a
        stopped engine cannot answer; the others restart as usual."""
        ...

    async def supervision(self) -> Supervision:
        """Who brings vLLM back while its process is gone, as this platform says; asked only then. Never raises:
        a platform that does not answer is UNKNOWN (the policy then gives a supervisor its whole --down-after)."""
        ...

    async def close(self) -> None: ...
