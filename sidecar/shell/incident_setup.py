"""Builds the incident recorder from the settings: where vLLM's processes, log and last /metrics come from.

Finds py-spy (the filesystem); nothing else is read until an incident is taken. Incidents are written where
the sidecar acts, as the restart ledger is: not in dry-run, nor with `--actuator none`, nor with
`--incidents-keep 0`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogSource
from sidecar.parse.vllm_process import VllmProcesses
from sidecar.shell.incident import IncidentRecorder, IncidentSettings, MetricsRead
from sidecar.shell.settings import Settings
from sidecar.sources.stack_dump import find_py_spy
from sidecar.sources.vllm_http import VllmHttpSource
from sidecar.sources.vllm_processes import find_vllm_processes


def build_recorder(
    settings: Settings,
    *,
    logger: FilteringBoundLogger,
    log_source: LogSource | None,
    vllm: VllmHttpSource,
    status_history: Callable[[], list[object]],
) -> IncidentRecorder | None:
    if settings.incidents_keep == 0 or settings.dry_run or settings.actuator == "none":
        return None
    url = urlsplit(settings.vllm_url)
    port = url.port or (443 if url.scheme == "https" else 80)

    def processes() -> VllmProcesses:
        return find_vllm_processes(port)

    def last_metrics() -> MetricsRead | None:
        if vllm.last_metrics is None:
            return None
        text, read_s = vllm.last_metrics
        return MetricsRead(text=text, wall_time_s=time.time() - (time.monotonic() - read_s))

    return IncidentRecorder(
        IncidentSettings(
            state_dir=settings.state_dir,
            keep=settings.incidents_keep,
            timeout_s=settings.incident_timeout,
            max_bytes=settings.incident_max_bytes,
            vllm_url=settings.vllm_url,
        ),
        logger=logger,
        log_source=log_source,
        py_spy=find_py_spy(),
        find_processes=processes,
        last_metrics=last_metrics,
        status_history=status_history,
    )
