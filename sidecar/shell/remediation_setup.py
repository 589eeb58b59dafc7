"""Builds the remediator from the settings (--remediate), or refuses the start with one line when it cannot work.

Remediation needs a restart adapter that starts vLLM with the flags file (systemd reads it through the unit's
`EnvironmentFile=`, the exec adapter's command through the shell it runs vLLM with) and vLLM's log. On
Kubernetes the flags live in the owning Deployment, which the sidecar does not patch yet: refused at start
rather than accepted and never applied.
"""

from __future__ import annotations

from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogSource
from sidecar.actuators.remediation_record import RecordError
from sidecar.notify.message import Notification
from sidecar.shell.remediating import RemediationSettings, Remediator
from sidecar.shell.remediation_store import RemediationStore
from sidecar.shell.settings import Settings, setting_error

ADAPTERS = ("systemd", "exec")


def build_remediator(
    settings: Settings,
    *,
    logger: FilteringBoundLogger,
    log_source: LogSource | None,
    notify: Callable[[Notification], None],
) -> Remediator | None:
    allowances = settings.remediation_allowances
    if not allowances:
        return None
    if settings.actuator not in ADAPTERS:
        why = (
            "the Kubernetes adapter does not change vLLM's flags yet (docs/remediation.md)"
            if settings.actuator == "kubernetes"
            else "vLLM's flags are changed for its next start, which only a restart adapter brings"
        )
        raise setting_error(settings, "remediate", f"needs --actuator systemd or exec: {why}", allowed=False)
    if log_source is None:
        raise setting_error(
            settings, "remediate", "needs vLLM's log to read why it died: give --vllm-log FILE", allowed=False
        )
    return Remediator(
        RemediationSettings(
            allowances=allowances,
            max_per_day=settings.remediate_max_per_day,
            window_s=settings.remediate_window,
            start_timeout_s=settings.startup_timeout,
        ),
        target=RemediationStore(settings.state_dir),
        source=log_source,
        notify=notify,
        logger=logger,
        dry_run=settings.dry_run,
    )


async def load_record(settings: Settings, remediator: Remediator) -> None:
    """Read the record before the daemon starts: one that cannot be used stops the start (exit 2) rather than
    let the sidecar change flags it cannot account for."""
    try:
        await remediator.load()
    except RecordError as error:
        raise setting_error(settings, "remediate", f"its record cannot be used: {error}", allowed=False) from None
