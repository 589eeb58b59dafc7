"""The notifier with scripted sinks: log first, queues, order, retries and backoff, overflow, stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from sidecar.notify.dispatcher import Notifier, SinkStats
from sidecar.notify.message import NotificationKind
from sidecar.notify.sink import DeliveryStatus
from tests.notify.conftest import OOM_CAUSE, note
from tests.notify.fakes import FakeSink, Sleeps, named

R = DeliveryStatus.RETRYABLE
P = DeliveryStatus.PERMANENT


def notifier(sinks: list[FakeSink], **kwargs: Any) -> Notifier:
    return Notifier(sinks, logger=structlog.get_logger(), **kwargs)


async def test_notify_logs_the_record_first_even_before_start() -> None:
    sink = FakeSink()
    with capture_logs() as logs:
        notifier([sink]).notify(note(details={"gpu": "0"}))
    [record] = logs
    assert record == {
        "event": "notification",
        "log_level": "warning",
        "kind": "pause",
        "summary": "admission paused: KV cache usage 0.93 >= 0.90",
        "reason": "kv_cache_usage",
        "dry_run": False,
        "details": {"gpu": "0"},
    }
    assert sink.sent == []


def test_the_record_says_why_vllm_died_when_the_notification_does() -> None:
    with capture_logs() as logs:
        notifier([]).notify(note(NotificationKind.VLLM_RECOVERED, cause=OOM_CAUSE))
    [record] = logs
    assert record["cause"] == OOM_CAUSE.line()
    assert record["cause"].startswith("cause configuration_overshoot: vLLM died of a CUDA out-of-memory error")
    assert record["cause_source"] == OOM_CAUSE.source


@pytest.mark.parametrize(
    ("kind", "level"),
    [
        (NotificationKind.PAUSE, "warning"),
        (NotificationKind.RESUME, "info"),
        (NotificationKind.RESTART_BEGIN, "warning"),
        (NotificationKind.RESTART_END, "info"),
        (NotificationKind.RESTART_FAILURE, "error"),
        (NotificationKind.BUDGET_EXHAUSTED, "error"),
    ],
)
def test_record_level_per_kind(kind: NotificationKind, level: str) -> None:
    with capture_logs() as logs:
        notifier([]).notify(note(kind))
    assert logs[0]["log_level"] == level


async def test_delivers_in_order_to_every_sink() -> None:
    first, second = FakeSink(name="a"), FakeSink(name="b")
    kinds = list(NotificationKind)
    with capture_logs() as logs:
        hub = notifier([first, second])
        hub.start()
        for kind in kinds:
            hub.notify(note(kind))
        await hub.stop(timeout_s=2)
    assert [n.kind for n in first.delivered] == kinds
    assert [n.kind for n in second.delivered] == kinds
    delivered = named(logs, "notification_delivered")
    assert len(delivered) == 2 * len(kinds)
    assert {line["sink"] for line in delivered} == {"a", "b"}
    assert all(line["attempts"] == 1 for line in delivered)
    assert named(logs, "notification_undelivered") == []


async def test_retries_with_exponential_backoff_then_delivers() -> None:
    sink = FakeSink([R, R, R])
    sleeps = Sleeps()
    with capture_logs() as logs:
        hub = notifier([sink], sleep=sleeps, jitter=lambda: 1.0, backoff_base_s=1, backoff_max_s=60)
        hub.start()
        hub.notify(note())
        await hub.stop(timeout_s=2)
    assert sleeps.delays == [1.0, 2.0, 4.0]
    assert len(sink.sent) == 4
    [delivered] = named(logs, "notification_delivered")
    assert delivered["attempts"] == 4
    assert named(logs, "notification_failed") == []
    assert len(named(logs, "notification_retrying")) == 3


async def test_backoff_is_capped_and_fully_jittered() -> None:
    sink = FakeSink([R] * 7)
    sleeps = Sleeps()
    hub = notifier([sink], sleep=sleeps, max_attempts=8, backoff_base_s=0.5, backoff_max_s=5)
    hub.start()
    hub.notify(note())
    await hub.stop(timeout_s=2)
    caps = [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert [hub.backoff_cap_s(attempt) for attempt in range(1, 8)] == caps
    assert len(sleeps.delays) == 7
    assert all(0.0 <= delay <= cap for delay, cap in zip(sleeps.delays, caps, strict=True))
    assert len(set(sleeps.delays)) > 1  # drawn, not fixed


async def test_zero_jitter_retries_at_once_and_retry_after_is_honoured() -> None:
    sleeps = Sleeps()
    hub = notifier([FakeSink([R, R], retry_after_s=90)], sleep=sleeps, jitter=lambda: 0.0, backoff_max_s=60)
    hub.start()
    hub.notify(note())
    await hub.stop(timeout_s=2)
    assert sleeps.delays == [60.0, 60.0]  # the receiver's wish, within the cap


async def test_gives_up_after_max_attempts_and_logs_once() -> None:
    sink = FakeSink(default=R)
    sleeps = Sleeps()
    with capture_logs() as logs:
        hub = notifier([sink], sleep=sleeps, max_attempts=3)
        hub.start()
        hub.notify(note(NotificationKind.RESTART_FAILURE))
        await hub.stop(timeout_s=2)
    assert len(sink.sent) == 3
    assert len(sleeps.delays) == 2
    [failed] = named(logs, "notification_failed")
    assert failed["log_level"] == "error"
    assert failed["kind"] == "restart_failure"
    assert failed["attempts"] == 3
    assert failed["permanent"] is False
    assert failed["error"] == "scripted retryable"
    assert hub.stats()[0].failed_total == 1


async def test_a_permanent_failure_is_not_retried() -> None:
    sink = FakeSink([P])
    sleeps = Sleeps()
    with capture_logs() as logs:
        hub = notifier([sink], sleep=sleeps)
        hub.start()
        hub.notify(note())
        await hub.stop(timeout_s=2)
    assert len(sink.sent) == 1
    assert sleeps.delays == []
    [failed] = named(logs, "notification_failed")
    assert failed["permanent"] is True
    assert failed["attempts"] == 1


async def test_a_sink_that_raises_is_retried_and_its_worker_survives() -> None:
    sink = FakeSink([RuntimeError("token=SECRET in a message"), P])
    with capture_logs() as logs:
        hub = notifier([sink], sleep=Sleeps())
        hub.start()
        hub.notify(note(NotificationKind.PAUSE))
        hub.notify(note(NotificationKind.RESUME))
        await hub.stop(timeout_s=2)
    assert [n.kind for n in sink.delivered] == [NotificationKind.RESUME]
    [failed] = named(logs, "notification_failed")
    assert failed["attempts"] == 2
    assert "SECRET" not in repr(logs)


async def test_overflow_drops_the_oldest_and_every_notification_is_still_logged() -> None:
    sink = FakeSink()
    kinds = list(NotificationKind)[:6]  # 6 notifications into a queue of 3
    with capture_logs() as logs:
        hub = notifier([sink], queue_size=3)
        for kind in kinds:
            hub.notify(note(kind))
        assert hub.stats()[0].queued == 3
        hub.start()
        await hub.stop(timeout_s=2)
    assert [line["kind"] for line in named(logs, "notification")] == [kind.value for kind in kinds]
    dropped = named(logs, "notification_dropped")
    assert [line["kind"] for line in dropped] == [kind.value for kind in kinds[:3]]
    assert all(line["sink"] == "fake" and line["queue_size"] == 3 for line in dropped)
    assert [n.kind for n in sink.delivered] == kinds[3:]
    assert hub.stats()[0].dropped_total == 3


async def test_overflow_never_drops_the_one_in_flight() -> None:
    gate = asyncio.Event()
    sink = FakeSink(gate=gate)
    with capture_logs() as logs:
        hub = notifier([sink], queue_size=1)
        hub.start()
        hub.notify(note(NotificationKind.RESTART_BEGIN))
        await sink.started.wait()
        hub.notify(note(NotificationKind.RESTART_END))
        hub.notify(note(NotificationKind.RESTART_FAILURE))
        assert hub.stats()[0] == SinkStats(
            sink="fake", queued=1, in_flight=True, delivered_total=0, failed_total=0, dropped_total=1
        )
        gate.set()
        await hub.stop(timeout_s=2)
    assert [n.kind for n in sink.delivered] == [NotificationKind.RESTART_BEGIN, NotificationKind.RESTART_FAILURE]
    assert [line["kind"] for line in named(logs, "notification_dropped")] == ["restart_end"]


async def test_a_hanging_sink_delays_neither_notify_nor_another_sink() -> None:
    hanging = FakeSink(name="hanging", gate=asyncio.Event())
    fast = FakeSink(name="fast")
    with capture_logs():
        hub = notifier([hanging, fast])
        hub.start()
        hub.notify(note(NotificationKind.PAUSE))
        await hanging.started.wait()
        started = time.thread_time()  # CPU time: what notify spends itself, whatever the machine's load
        returned = hub.notify(note(NotificationKind.RESUME))  # type: ignore[func-returns-value]
        spent_s = time.thread_time() - started
        assert returned is None  # a plain call, nothing to await: it queues and returns
        await fast.wait_delivered(2)
        await hub.stop(timeout_s=0.05)
    assert spent_s < 0.005
    assert len(hanging.delivered) == 0


async def test_stop_drains_what_is_queued() -> None:
    sink = FakeSink([R, R])
    with capture_logs() as logs:
        hub = notifier([sink], sleep=Sleeps())
        for kind in list(NotificationKind)[:3]:
            hub.notify(note(kind))
        hub.start()
        await hub.stop(timeout_s=2)
    assert len(sink.delivered) == 3
    assert named(logs, "notification_undelivered") == []
    assert hub.stats()[0].delivered_total == 3


@pytest.mark.looptime
async def test_stop_cancels_after_the_timeout_and_logs_what_was_left() -> None:
    loop = asyncio.get_running_loop()
    sink = FakeSink(name="stuck", gate=asyncio.Event())
    with capture_logs() as logs:
        hub = notifier([sink])
        hub.start()
        hub.notify(note(NotificationKind.RESTART_BEGIN))
        hub.notify(note(NotificationKind.RESTART_END))
        await sink.started.wait()
        started = loop.time()
        await hub.stop(timeout_s=5.0)
        elapsed_s = loop.time() - started
    assert elapsed_s == pytest.approx(5.0, abs=1e-3)  # virtual time: exactly its timeout, never longer
    undelivered = named(logs, "notification_undelivered")
    assert [(line["sink"], line["kind"]) for line in undelivered] == [
        ("stuck", "restart_begin"),
        ("stuck", "restart_end"),
    ]
    assert hub.stats()[0] == SinkStats(
        sink="stuck", queued=0, in_flight=False, delivered_total=0, failed_total=0, dropped_total=0
    )


async def test_stop_without_start_logs_the_queue_as_undelivered_and_later_notifications_are_only_logged() -> None:
    sink = FakeSink()
    with capture_logs() as logs:
        hub = notifier([sink])
        hub.notify(note())
        await hub.stop(timeout_s=0.1)
        hub.notify(note(NotificationKind.RESUME))
    assert [line["event"] for line in logs] == ["notification", "notification_undelivered", "notification"]
    assert hub.stats()[0].queued == 0
    assert sink.sent == []


@pytest.mark.parametrize(
    "kwargs",
    [{"queue_size": 0}, {"max_attempts": 0}, {"backoff_base_s": -1}, {"backoff_base_s": 10, "backoff_max_s": 5}],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="notification"):
        notifier([], **kwargs)
