"""Fixtures for the notification tests: a notification builder, an HTTP client, an origin."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sidecar.model.cause import CrashCause, FlagChange
from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.payload import Origin

ORIGIN = Origin(host="gpu-node-7", pod="vllm-0")
OOM_CAUSE = CrashCause(
    cause="configuration_overshoot",
    severity="critical",
    summary="vLLM died of a CUDA out-of-memory error while serving: another process took the memory",
    evidence=("CUDA out of memory while serving: tried to allocate 2.00 GiB", "another process on the GPU: pid 7"),
    recommendations=(
        FlagChange(
            flag="--gpu-memory-utilization", value=0.87, why="(80 - 6 - 4) / 80", pasted="--gpu-memory-utilization 0.87"
        ),
        FlagChange(flag="--enforce-eager", value="", why="no CUDA graphs", pasted="--enforce-eager"),
    ),
    source="journal of vllm.service (system manager), invocation 2a14, 13 lines",
    read_wall_time_s=1_700_000_001.25,
)
UNKNOWN_CAUSE = CrashCause(
    cause=None,
    severity=None,
    summary="cannot read file /var/log/vllm.log: Permission denied",
    evidence=(),
    recommendations=(),
    source="file /var/log/vllm.log",
    read_wall_time_s=1_700_000_001.25,
)


def note(
    kind: NotificationKind = NotificationKind.PAUSE,
    *,
    summary: str = "admission paused: KV cache usage 0.93 >= 0.90",
    reason: str = "kv_cache_usage",
    dry_run: bool = False,
    details: dict[str, str] | None = None,
    cause: CrashCause | None = None,
    incident: str | None = None,
) -> Notification:
    return Notification(
        kind=kind,
        summary=summary,
        reason=reason,
        wall_time_s=1_700_000_000.5,
        dry_run=dry_run,
        details=details if details is not None else {"kv_cache_usage_ratio": "0.93"},
        cause=cause,
        incident=incident,
    )


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as http:
        yield http
