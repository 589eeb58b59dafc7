"""Builds the remediator from the settings (--remediate), or refuses the start with one line when it cannot work.

Remediation needs vLLM's log and a restart adapter whose vLLM reads the flags: systemd and exec start it with the
flags file of the state dir (the unit's `EnvironmentFile=`, the shell the exec command runs vLLM with); on
Kubernetes they go into vLLM's args in the Deployment that owns the pod (`ActingParts.flags_target`, built
with the adapter's client), whose rollout is the restart that applies them.
"""

from __future__ import annotations

from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogSource
from sidecar.actuators.remediation_record import RecordError
from sidecar.notify.message import Notification
from sidecar.shell.remediating import RemediationSettings, Remediator
from sidecar.shell.remediation_store import FlagsTarget, RemediationStore
from sidecar.shell.settings import Settings, setting_error

ADAPTERS = ("systemd", "exec", "kubernetes")


def build_remediator(
    settings: Settings,
    *,
    logger: FilteringBoundLogger,
    log_source: LogSource | None,
    notify: Callable[[Notification], None],
    flags_target: FlagsTarget | None = None,
) -> Remediator | None:
    """The remediator; `flags_target` is the platform's, given on Kubernetes (elsewhere the state dir's files)."""
    allowances = settings.remediation_allowances
    if not allowances:
        return None
    if settings.actuator not in ADAPTERS:
        why = "vLLM's flags are changed for its next start, which only a restart adapter brings"
        raise setting_error(
            settings, "remediate", f"needs --actuator systemd, exec or kubernetes: {why}", allowed=False
        )
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
        target=_target(settings, flags_target),
        source=log_source,
        notify=notify,
        logger=logger,
        dry_run=settings.dry_run,
    )


def _target(settings: Settings, platform: FlagsTarget | None) -> FlagsTarget:
    if settings.actuator != "kubernetes":
        return RemediationStore(settings.state_dir)
    if platform is None:  # the state dir's files would never reach vLLM's args
        raise ValueError("--remediate with --actuator kubernetes needs the Deployment's flags target")
    return platform


async def load_record(settings: Settings, remediator: Remediator) -> None:
    """Read the record before the daemon starts: one that cannot be used stops the start (exit 2) rather than
    let the sidecar change flags it cannot account for."""
    try:
        await remediator.load()
    except RecordError as error:
        raise setting_error(settings, "remediate", f"its record cannot be used: {error}", allowed=False) from None
