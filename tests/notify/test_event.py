"""Kubernetes Events through the `EventSink` protocol: reason per kind, Warning for bad news, never raises."""

from __future__ import annotations

import pytest
import structlog
from structlog.testing import capture_logs

from sidecar.notify.dispatcher import Notifier
from sidecar.notify.event import MAX_MESSAGE_CHARS, EventNotificationSink
from sidecar.notify.message import NotificationKind
from sidecar.notify.sink import DeliveryStatus
from tests.notify.conftest import OOM_CAUSE, note
from tests.notify.fakes import FakeEvents, Sleeps


@pytest.mark.parametrize(
    ("kind", "reason", "warning"),
    [
        (NotificationKind.PAUSE, "AdmissionPaused", False),
        (NotificationKind.RESUME, "AdmissionResumed", False),
        (NotificationKind.RESTART_BEGIN, "RestartStarted", False),
        (NotificationKind.RESTART_END, "RestartCompleted", False),
        (NotificationKind.RESTART_FAILURE, "RestartFailed", True),
        (NotificationKind.BUDGET_EXHAUSTED, "RestartBudgetExhausted", True),
    ],
)
async def test_reason_and_type_per_kind(kind: NotificationKind, reason: str, warning: bool) -> None:
    events = FakeEvents()
    result = await EventNotificationSink(events).send(note(kind, summary="something happened", reason="why"))
    assert result.status is DeliveryStatus.DELIVERED
    assert events.emitted == [(reason, "something happened (reason why)", warning)]


async def test_a_dry_run_event_says_would_and_a_long_message_is_cut() -> None:
    events = FakeEvents()
    sink = EventNotificationSink(events)
    await sink.send(note(summary="restart vLLM", dry_run=True))
    await sink.send(note(summary="x" * 5000))
    assert events.emitted[0][1].startswith("[dry run] would: restart vLLM")
    assert len(events.emitted[1][1]) == MAX_MESSAGE_CHARS
    assert events.emitted[1][1].endswith("…")


async def test_the_event_says_why_vllm_died_and_stays_bounded() -> None:
    events = FakeEvents()
    sink = EventNotificationSink(events)
    await sink.send(
        note(NotificationKind.VLLM_RECOVERED, summary="vLLM is back", reason="engine_dead", cause=OOM_CAUSE)
    )
    await sink.send(note(summary="x" * 900, cause=OOM_CAUSE))
    assert events.emitted[0] == (
        "VllmRecovered",
        "vLLM is back (reason engine_dead). cause configuration_overshoot: vLLM died of a CUDA out-of-memory "
        "error while serving: another process took the memory; change --gpu-memory-utilization 0.87, "
        "--enforce-eager",
        True,
    )
    assert len(events.emitted[1][1]) == MAX_MESSAGE_CHARS


async def test_the_event_names_the_incident_whole_even_when_the_message_is_cut() -> None:
    events = FakeEvents()
    sink = EventNotificationSink(events)
    folder = "/var/lib/vllm-sidecar/incidents/20231114T221320Z-engine_hung"
    await sink.send(note(NotificationKind.RESTART_END, summary="vLLM healthy again", incident=folder))
    await sink.send(note(summary="x" * 5000, cause=OOM_CAUSE, incident=folder))
    assert events.emitted[0][1] == f"vLLM healthy again (reason kv_cache_usage). incident {folder}"
    assert len(events.emitted[1][1]) == MAX_MESSAGE_CHARS
    assert events.emitted[1][1].endswith(f"…. incident {folder}")


async def test_an_emit_that_raises_is_retryable() -> None:
    result = await EventNotificationSink(FakeEvents(error=PermissionError("events is forbidden"))).send(note())
    assert result.status is DeliveryStatus.RETRYABLE
    assert result.detail == "PermissionError: events is forbidden"


async def test_an_emit_that_hangs_times_out() -> None:
    result = await EventNotificationSink(FakeEvents(hang=True), timeout_s=0.05).send(note())
    assert result.status is DeliveryStatus.RETRYABLE
    assert result.detail == "timed out after 0.05 s"


async def test_events_go_through_the_notifier_like_any_sink() -> None:
    events = FakeEvents()
    with capture_logs() as logs:
        hub = Notifier([EventNotificationSink(events)], logger=structlog.get_logger(), sleep=Sleeps())
        hub.start()
        hub.notify(note(NotificationKind.BUDGET_EXHAUSTED, summary="restart budget spent", reason="budget"))
        await hub.stop(timeout_s=2)
    assert events.emitted == [("RestartBudgetExhausted", "restart budget spent (reason budget)", True)]
    assert [line["sink"] for line in logs if line["event"] == "notification_delivered"] == ["kubernetes events"]
