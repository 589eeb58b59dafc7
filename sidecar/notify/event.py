"""Adapts a platform `EventSink` (Kubernetes Events on the pod) into a notification sink.

The I/O is the wrapped sink's; this module only chooses the event's reason, type and message, bounds the
call in time and turns whatever it raises into a retryable result, as every notification sink must.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.sink import DeliveryResult, DeliveryStatus


class EventSink(Protocol):
    """Where platform events go (Kubernetes Events on the pod); optional per adapter."""

    async def emit(self, *, reason: str, message: str, warning: bool) -> None: ...


EVENT_REASONS: dict[NotificationKind, str] = {
    NotificationKind.PAUSE: "AdmissionPaused",
    NotificationKind.RESUME: "AdmissionResumed",
    NotificationKind.RESTART_BEGIN: "RestartStarted",
    NotificationKind.RESTART_END: "RestartCompleted",
    NotificationKind.RESTART_FAILURE: "RestartFailed",
    NotificationKind.BUDGET_EXHAUSTED: "RestartBudgetExhausted",
    NotificationKind.VLLM_RECOVERED: "VllmRecovered",
    NotificationKind.REMEDIATION: "FlagsRemediated",
}
WARNING_KINDS = frozenset(
    {
        NotificationKind.RESTART_FAILURE,
        NotificationKind.BUDGET_EXHAUSTED,
        NotificationKind.VLLM_RECOVERED,
        NotificationKind.REMEDIATION,
    }
)
MAX_MESSAGE_CHARS = 1024  # the API server truncates longer Event messages; cut them here, visibly


def event_message(notification: Notification) -> str:
    """`[dry run] would: <summary> (reason <reason>)`, then `. <cause line>` when vLLM's log said why it died,
    and `. incident <folder>` when one was kept; at most 1024 characters, the folder always whole."""
    would = "[dry run] would: " if notification.dry_run else ""
    message = f"{would}{notification.summary} (reason {notification.reason})"
    if notification.cause is not None:
        message += ". " + " ".join(notification.cause.line().split())
    incident = f". incident {notification.incident}" if notification.incident is not None else ""
    room = MAX_MESSAGE_CHARS - len(incident)
    if len(message) > room:
        message = message[: room - 1] + "…"
    return message + incident


class EventNotificationSink:
    """Posts each notification as one Event: Normal, or Warning for a failed restart or a spent budget."""

    def __init__(
        self,
        events: EventSink,
        *,
        name: str = "kubernetes events",
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._events = events
        self._name = name
        self._timeout_s = timeout_s
        self._clock = clock

    @property
    def name(self) -> str:
        return self._name

    async def send(self, notification: Notification) -> DeliveryResult:
        started = self._clock()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._events.emit(
                    reason=EVENT_REASONS[notification.kind],
                    message=event_message(notification),
                    warning=notification.kind in WARNING_KINDS,
                )
        except TimeoutError:
            detail = f"timed out after {self._timeout_s:g} s"
            return DeliveryResult(status=DeliveryStatus.RETRYABLE, detail=detail, duration_s=self._clock() - started)
        except Exception as error:  # noqa: BLE001 - the protocol names no errors; a sink reports, never raises
            text = " ".join(str(error).split())[:200]
            detail = f"{type(error).__name__}: {text}" if text else type(error).__name__
            return DeliveryResult(status=DeliveryStatus.RETRYABLE, detail=detail, duration_s=self._clock() - started)
        return DeliveryResult(
            status=DeliveryStatus.DELIVERED, detail="event posted", duration_s=self._clock() - started
        )
