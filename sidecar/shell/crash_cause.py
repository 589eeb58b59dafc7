"""The explain step: before a notification about a death or a restart goes out, read why vLLM died. Async I/O.

Sits between acting and the notifier (`notify` in, `deliver` out) and changes nothing else:
- `restart_begin` of a restart for a dead engine and `vllm_recovered` get the cause of the start of vLLM
  that died (`Wanted.DIED`);
- `restart_begin` of any other restart goes out at once; the log of the vLLM about to be restarted is read
  behind it (`Wanted.LAST`) and kept;
- `restart_end` gets what was read at its restart's begin (after the restart the log shows the new start),
  or, without one, the cause of the start that died;
- everything else goes out as it is.

One worker task takes notifications in order, so nothing overtakes one whose log is being read; with
nothing waiting, a notification that needs no log goes out at once, as before. A read is bounded in time
(`timeout_s`) as well as in bytes (by the reader); parsing runs in a worker thread. A log that cannot be
read leaves the notification as it was, plus a cause whose summary says why it is unknown; that reason is
logged once (again only when it changes), never with a traceback. The last cause read is kept for /status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogSource, LogUnreadableError, Wanted
from sidecar.model.cause import CrashCause
from sidecar.notify.message import Notification, NotificationKind

READ_TIMEOUT_S = 5.0
QUEUE_SIZE = 100
NO_SOURCE = (
    "no vLLM log to read: set --vllm-log FILE (the systemd and Kubernetes adapters read the journal and the "
    "pod's log themselves)"
)
ENGINE_DEAD = "engine_dead"  # RestartReason.ENGINE_DEAD, as a notification's reason carries it


class _Step(StrEnum):
    FORWARD = "forward"
    ATTACH = "attach"  # read the start that died, attach it
    REMEMBER = "remember"  # deliver now, then read the start about to be restarted, for restart_end
    ATTACH_REMEMBERED = "attach_remembered"


@dataclass(slots=True, kw_only=True)
class _Item:
    notification: Notification
    step: _Step
    delivered: bool = False  # a REMEMBER item sent on at once: only its read is left


def step_for(notification: Notification) -> _Step:
    kind = notification.kind
    if kind is NotificationKind.VLLM_RECOVERED:
        return _Step.ATTACH
    if kind is NotificationKind.RESTART_BEGIN:
        return _Step.ATTACH if notification.reason == ENGINE_DEAD else _Step.REMEMBER
    if kind is NotificationKind.RESTART_END:
        return _Step.ATTACH_REMEMBERED
    return _Step.FORWARD


async def read_cause(
    source: LogSource, wanted: Wanted, *, until_wall_s: float, timeout_s: float, wall_time_s: float
) -> CrashCause | str:
    """Why vLLM's `wanted` start died (or what its log shows), as the doctor reads it; one line saying why not
    when the log cannot be read within `timeout_s` or the doctor chokes on it. Never raises."""
    try:
        async with asyncio.timeout(timeout_s):
            read = await source.read(until_wall_s=until_wall_s, wanted=wanted)
        # The doctor's rules load with the first log read, not at start: a sidecar that never sees a death
        # does not carry them (measured: 1.4 MB of peak RSS and 75 ms of start-up).
        from sidecar.shell.cause_reading import explain  # noqa: PLC0415

        return await asyncio.to_thread(explain, read, wanted, wall_time_s=wall_time_s)
    except TimeoutError:
        return f"reading {source.where} took longer than {timeout_s:g} s"
    except LogUnreadableError as error:
        return f"cannot read {source.where}: {error}"
    except Exception as error:  # noqa: BLE001 - a log the doctor chokes on must stop neither notifications nor acting
        return f"reading {source.where} failed: {type(error).__name__}: {' '.join(str(error).split())[:200]}"


class CrashCauseStep:
    def __init__(
        self,
        source: LogSource | None,
        *,
        deliver: Callable[[Notification], None],
        logger: FilteringBoundLogger,
        timeout_s: float = READ_TIMEOUT_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._deliver = deliver
        self._log = logger
        self._timeout_s = timeout_s
        self._wall_clock = wall_clock
        self._queue: deque[_Item] = deque()
        self._wakeup = asyncio.Event()
        self._busy = False
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._restart_cause: CrashCause | None = None  # read at the begin of the restart in progress
        self._problem: str | None = None  # the last reason a log could not be read, logged once
        self.last: CrashCause | None = None  # the last cause read, for /status

    def notify(self, notification: Notification) -> None:
        """Hand `notification` on, now or after its log is read; never blocks, never raises."""
        step = step_for(notification)
        delivered = False
        if step in (_Step.FORWARD, _Step.REMEMBER) and not self._queue and not self._busy:
            self._deliver(notification)  # nothing waits before it: out at once, as without this step
            if step is _Step.FORWARD:
                return
            delivered = True
        if self._closed or not self._start_worker():
            if not delivered:
                self._deliver(self._unexplained(notification, step, "the sidecar is stopping"))
            return
        if len(self._queue) >= QUEUE_SIZE:  # the oldest waiting goes out as it is: order kept, memory bounded
            index = 1 if self._busy else 0  # not the one being read: its worker delivers it
            oldest = self._queue[index]
            del self._queue[index]
            if not oldest.delivered:
                self._deliver(self._unexplained(oldest.notification, oldest.step, "too many notifications waiting"))
        self._queue.append(_Item(notification=notification, step=step, delivered=delivered))
        self._wakeup.set()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Finish what is queued within `timeout_s`; what is left goes out without its cause."""
        self._closed = True
        self._wakeup.set()
        worker = self._worker
        if worker is not None:
            _, pending = await asyncio.wait({worker}, timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        while self._queue:
            item = self._queue.popleft()
            if not item.delivered:
                self._deliver(self._unexplained(item.notification, item.step, "the sidecar stopped before reading it"))

    def _start_worker(self) -> bool:
        if self._worker is not None and not self._worker.done():
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._worker = loop.create_task(self._work(), name="crash cause")
        return True

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if self._closed:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            item = self._queue[0]  # stays queued while read: close() sends it out if it is cut short
            self._busy = True
            try:
                await self._handle(item)
            except Exception as error:  # noqa: BLE001 - a bug here must cost the cause, never the notification
                self._log.error("crash_cause_failed", error=f"{type(error).__name__}: {error}")
                if self._queue and self._queue[0] is item and not item.delivered:
                    self._deliver(self._unexplained(item.notification, item.step, "reading it failed"))
            finally:
                self._busy = False
            if self._queue and self._queue[0] is item:
                self._queue.popleft()

    async def _handle(self, item: _Item) -> None:
        notification = item.notification
        if item.step is _Step.FORWARD:
            self._deliver(notification)
        elif item.step is _Step.REMEMBER:
            if not item.delivered:
                self._deliver(notification)
            self._queue.popleft()  # delivered: a cut-short read must not send it twice
            self._restart_cause = await self._read(Wanted.LAST, notification)
        elif item.step is _Step.ATTACH:
            cause = await self._read(Wanted.DIED, notification)
            if notification.kind is NotificationKind.RESTART_BEGIN:
                self._restart_cause = cause
            self._deliver(dataclasses.replace(notification, cause=cause))
        else:
            cause = self._restart_cause or await self._read(Wanted.DIED, notification)
            self._restart_cause = None
            self._deliver(dataclasses.replace(notification, cause=cause))

    async def _read(self, wanted: Wanted, notification: Notification) -> CrashCause:
        source = self._source
        now = self._wall_clock()
        if source is None:
            return self._failed(NO_SOURCE, "no log configured", now)
        cause = await read_cause(
            source, wanted, until_wall_s=notification.wall_time_s, timeout_s=self._timeout_s, wall_time_s=now
        )
        if isinstance(cause, str):
            return self._failed(cause, source.where, now)
        self._problem = None
        self.last = cause
        self._log.info(
            "crash_cause",
            kind=notification.kind.value,
            wanted=wanted.value,
            cause=cause.cause,
            summary=cause.summary,
            recommended=[change.pasted for change in cause.recommendations],
            source=cause.source,
        )
        return cause

    def _failed(self, why: str, source: str, now: float) -> CrashCause:
        cause = CrashCause.unknown(why, source=source, wall_time_s=now)
        self.last = cause
        if cause.summary != self._problem:
            self._problem = cause.summary
            self._log.warning("crash_cause_unknown", reason=cause.summary)
        return cause

    def _unexplained(self, notification: Notification, step: _Step, why: str) -> Notification:
        if step in (_Step.FORWARD, _Step.REMEMBER):
            return notification
        where = self._source.where if self._source is not None else "no log configured"
        cause = CrashCause.unknown(f"vLLM's log was not read: {why}", source=where, wall_time_s=self._wall_clock())
        return dataclasses.replace(notification, cause=cause)
