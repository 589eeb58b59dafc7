"""The adapter for deployments that only observe and pause: a restart is refused, clearly. No I/O."""

from __future__ import annotations

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.model.supervision import Restarter, Supervision


class NoActuator:
    name = "none"

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        return ActuatorOutcome(
            status=OutcomeStatus.FAILED,
            detail="no restart adapter is configured (--actuator none): observe and pause only",
            duration_s=0.0,
        )

    async def supervision(self) -> Supervision:
        return Supervision(restarter=Restarter.UNKNOWN, detail="no restart adapter (--actuator none)")

    async def close(self) -> None:
        return None
