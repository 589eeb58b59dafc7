"""Fixtures for the notification tests: a notification builder, an HTTP client, an origin."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.payload import Origin

ORIGIN = Origin(host="gpu-node-7", pod="vllm-0")


def note(
    kind: NotificationKind = NotificationKind.PAUSE,
    *,
    summary: str = "admission paused: KV cache usage 0.93 >= 0.90",
    reason: str = "kv_cache_usage",
    dry_run: bool = False,
    details: dict[str, str] | None = None,
) -> Notification:
    return Notification(
        kind=kind,
        summary=summary,
        reason=reason,
        wall_time_s=1_700_000_000.5,
        dry_run=dry_run,
        details=details if details is not None else {"kv_cache_usage_ratio": "0.93"},
    )


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as http:
        yield http
