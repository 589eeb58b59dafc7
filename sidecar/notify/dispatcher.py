"""Sends notifications to every sink in the background: the log first, then bounded queues and retries.

Does I/O through its sinks and owns asyncio tasks (one worker per sink). `notify` is synchronous and O(1) per
sink, so the tick that calls it never waits on a network:

1. the notification is logged (event `notification`): the log is the record, whatever happens after;
2. it is queued for each remote sink; a full queue drops its oldest waiting item (logged as
   `notification_dropped`; that record is already in the log);
3. each sink's worker delivers its queue in order, retrying what is retryable with exponential backoff and
   full jitter (a delay drawn uniformly from 0 to min(max, base * 2^(attempt - 1))) for as long as the
   notification has waited less than `give_up_after_s` (and, when set, up to `max_attempts`), then logs
   `notification_delivered` or, once per notification, `notification_failed`.

Why a time limit rather than a few attempts: a receiver that is down for a minute (a restart, a deploy) must
not cost the page it would have received; five attempts with a one-second base span about 15 s at most. The
queue bound still keeps memory bounded while it is down: newer notifications push out the oldest waiting.

A slow or dead sink only ever delays its own queue. Logs name a sink by its `name`, which never holds a
secret (webhook URLs are redacted by the sink), and never carry a URL, a token or a key.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.sink import DeliveryResult, DeliveryStatus, NotificationSink

_RECORD_LEVEL: dict[NotificationKind, str] = {
    NotificationKind.PAUSE: "warning",
    NotificationKind.RESUME: "info",
    NotificationKind.RESTART_BEGIN: "warning",
    NotificationKind.RESTART_END: "info",
    NotificationKind.RESTART_FAILURE: "error",
    NotificationKind.BUDGET_EXHAUSTED: "error",
    NotificationKind.VLLM_RECOVERED: "warning",
    NotificationKind.REMEDIATION: "warning",
}
_MAX_EXPONENT = 30  # 2^30 x any sane base is far past any cap; keeps the float finite for absurd attempt counts


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkStats:
    """One sink's state, safe for /status: its redacted name and counters."""

    sink: str
    queued: int  # waiting, not counting the one being delivered
    in_flight: bool
    delivered_total: int
    failed_total: int
    dropped_total: int


@dataclass(slots=True, kw_only=True)
class _Item:
    notification: Notification
    queued_s: float


class _Lane:
    """One sink, its queue and its worker."""

    def __init__(self, sink: NotificationSink) -> None:
        self.sink = sink
        self.queue: deque[_Item] = deque()
        self.wakeup = asyncio.Event()
        self.in_flight: _Item | None = None
        self.task: asyncio.Task[None] | None = None
        self.delivered_total = 0
        self.failed_total = 0
        self.dropped_total = 0


class Notifier:
    def __init__(
        self,
        sinks: Sequence[NotificationSink],
        *,
        logger: FilteringBoundLogger,
        queue_size: int = 100,
        max_attempts: int | None = None,  # None: no limit on attempts, only give_up_after_s
        give_up_after_s: float = 3600.0,  # a page an hour late still tells what happened; later it is noise
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        jitter: Callable[[], float] = random.random,  # uniform in [0, 1); not for secrets, only for spreading retries
    ) -> None:
        if queue_size < 1:
            raise ValueError("notification queue size must be >= 1")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("notification max attempts must be >= 1")
        if not give_up_after_s > 0:
            raise ValueError("notification give-up time must be > 0 seconds")
        if backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("notification backoff needs 0 <= base <= max")
        self._lanes = [_Lane(sink) for sink in sinks]
        self._log = logger
        self._queue_size = queue_size
        self._max_attempts = max_attempts
        self._give_up_after_s = give_up_after_s
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter
        self._closing = False
        self._closed = False

    def notify(self, notification: Notification) -> None:
        """Log the notification, then queue it for every sink. Never blocks, never raises on a full queue."""
        self._record(notification)
        if self._closed:
            return  # stopped: the log line above is all there is
        now = self._clock()
        for lane in self._lanes:
            if len(lane.queue) >= self._queue_size:
                dropped = lane.queue.popleft()
                lane.dropped_total += 1
                self._log.warning(
                    "notification_dropped",
                    sink=lane.sink.name,
                    kind=dropped.notification.kind.value,
                    summary=dropped.notification.summary,
                    queue_size=self._queue_size,
                )
            lane.queue.append(_Item(notification=notification, queued_s=now))
            lane.wakeup.set()

    def start(self) -> None:
        """Start one worker per sink on the running loop. What was queued before starts going out now."""
        for lane in self._lanes:
            if lane.task is None:
                lane.task = asyncio.get_running_loop().create_task(self._work(lane), name=f"notify {lane.sink.name}")

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Deliver what can be delivered within `timeout_s`, then cancel and log each undelivered item."""
        self._closing = True
        for lane in self._lanes:
            lane.wakeup.set()
        tasks = [lane.task for lane in self._lanes if lane.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for lane in self._lanes:
            left = ([lane.in_flight] if lane.in_flight is not None else []) + list(lane.queue)
            for item in left:
                self._log.warning(
                    "notification_undelivered",
                    sink=lane.sink.name,
                    kind=item.notification.kind.value,
                    summary=item.notification.summary,
                )
            lane.queue.clear()
            lane.in_flight = None
            lane.task = None
        self._closed = True

    def stats(self) -> tuple[SinkStats, ...]:
        return tuple(
            SinkStats(
                sink=lane.sink.name,
                queued=len(lane.queue),
                in_flight=lane.in_flight is not None,
                delivered_total=lane.delivered_total,
                failed_total=lane.failed_total,
                dropped_total=lane.dropped_total,
            )
            for lane in self._lanes
        )

    def backoff_cap_s(self, attempt: int) -> float:
        """The most the wait after failed attempt number `attempt` (1-based) can be: base * 2^(attempt-1), capped."""
        return min(self._backoff_max_s, self._backoff_base_s * 2.0 ** min(attempt - 1, _MAX_EXPONENT))

    def _record(self, notification: Notification) -> None:
        log = getattr(self._log, _RECORD_LEVEL[notification.kind])
        # The record says why vLLM died too, when its log said it: the log is the record if no sink delivers.
        cause = notification.cause
        why = {} if cause is None else {"cause": cause.line(), "cause_source": cause.source}
        log(
            "notification",
            kind=notification.kind.value,
            summary=notification.summary,
            reason=notification.reason,
            dry_run=notification.dry_run,
            details=dict(notification.details),
            **why,
        )

    async def _work(self, lane: _Lane) -> None:
        while True:
            if not lane.queue:
                if self._closing:
                    return
                lane.wakeup.clear()
                await lane.wakeup.wait()
                continue
            item = lane.queue.popleft()
            lane.in_flight = item
            await self._deliver(lane, item)
            lane.in_flight = None

    async def _deliver(self, lane: _Lane, item: _Item) -> None:
        notification = item.notification
        attempt = 0
        while True:
            attempt += 1
            result = await self._attempt(lane.sink, notification)
            if result.status is DeliveryStatus.DELIVERED:
                lane.delivered_total += 1
                self._log.info(
                    "notification_delivered",
                    sink=lane.sink.name,
                    kind=notification.kind.value,
                    attempts=attempt,
                    latency_s=round(self._clock() - item.queued_s, 3),
                )
                return
            if result.status is DeliveryStatus.PERMANENT or self._gives_up(attempt, item):
                break
            delay_s = self._delay_s(attempt, result.retry_after_s)
            self._log.debug(
                "notification_retrying",
                sink=lane.sink.name,
                kind=notification.kind.value,
                attempt=attempt,
                delay_s=round(delay_s, 3),
                error=result.detail,
            )
            await self._sleep(delay_s)
        lane.failed_total += 1
        self._log.error(
            "notification_failed",
            sink=lane.sink.name,
            kind=notification.kind.value,
            attempts=attempt,
            permanent=result.status is DeliveryStatus.PERMANENT,
            error=result.detail,
        )

    async def _attempt(self, sink: NotificationSink, notification: Notification) -> DeliveryResult:
        started = self._clock()
        try:
            return await sink.send(notification)
        except Exception as error:  # noqa: BLE001 - sinks must not raise; one that does must not kill its worker
            # Only the type: a misbehaving sink's message could hold what its name was careful to hide.
            detail = f"{type(error).__name__} raised by the sink"
            return DeliveryResult(status=DeliveryStatus.RETRYABLE, detail=detail, duration_s=self._clock() - started)

    def _gives_up(self, attempt: int, item: _Item) -> bool:
        if self._max_attempts is not None and attempt >= self._max_attempts:
            return True
        return self._clock() - item.queued_s >= self._give_up_after_s

    def _delay_s(self, attempt: int, retry_after_s: float | None) -> float:
        delay_s = self._jitter() * self.backoff_cap_s(attempt)
        if retry_after_s is not None:
            delay_s = max(delay_s, min(retry_after_s, self._backoff_max_s))
        return delay_s
