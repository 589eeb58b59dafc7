"""What the notifier asks of a remote sink, and what one delivery attempt reports. No I/O here.

A sink makes exactly one attempt per `send` and never raises: the notifier owns queueing, retries and
backoff, so every sink behaves the same under a slow or dead receiver.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sidecar.notify.message import Notification


class DeliveryStatus(StrEnum):
    DELIVERED = "delivered"
    RETRYABLE = "retryable"  # 429, 5xx, timeout, connection error: worth another attempt later
    PERMANENT = "permanent"  # the receiver refused it (other 4xx, bad URL): retrying cannot help


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    status: DeliveryStatus
    detail: str  # one line for logs; never a secret (no URL path or query, no key)
    duration_s: float
    retry_after_s: float | None = None  # the receiver asked to wait this long (429 Retry-After)


class NotificationSink(Protocol):
    @property
    def name(self) -> str:
        """How logs and /status name this sink; safe to show (a webhook's URL is redacted)."""
        ...

    async def send(self, notification: Notification) -> DeliveryResult: ...
