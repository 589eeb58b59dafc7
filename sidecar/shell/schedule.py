"""The tick's schedule: APScheduler's one interval job, kept on time when the wall clock jumps. Reads both clocks.

Built on APScheduler 3's public API only: a scheduler configured with its job store and executor, an interval
trigger's `get_next_fire_time`, `get_job`/`modify_job`, and event listeners.

APScheduler 3 times its jobs by the wall clock (`datetime.now`), which NTP steps, VM resumes and a host that
booted with a dead RTC move by minutes to decades. Left alone:
- a jump back of N seconds leaves the next run N seconds in the future: no poll, no policy, for as long as
  the jump (an NTP step back of an hour is an hour blind). `OnTime` watches the schedule by the monotonic clock
  and pulls the next run in;
- a jump forward makes the interval trigger walk through every missed run one at a time to find the next one
  (20 years at 2 s: 3 x 10^8 steps, minutes of a frozen event loop and gigabytes of datetimes).
  `SteadyInterval` skips them in one step.

The watch costs no wake-up between ticks: it is a monotonic deadline that every run of the job (APScheduler's
`EVENT_JOB_SUBMITTED`, or `EVENT_JOB_MAX_INSTANCES` while the previous tick still runs) pushes back, so it fires
only when a tick is overdue.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_SUBMITTED, JobSubmissionEvent
from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from structlog.typing import FilteringBoundLogger

TICK_JOB = "tick"
WALL_JUMP_S = 1.0  # a change of wall minus monotonic time bigger than this is a jump, not drift or slewing
# The scheduler is on time: a run started, or came due while the previous tick still ran (max_instances=1).
ON_TIME_EVENTS = EVENT_JOB_SUBMITTED | EVENT_JOB_MAX_INSTANCES


class SteadyInterval(IntervalTrigger):  # type: ignore[misc] # apscheduler has no type hints: its classes are Any
    """An interval trigger whose next run after a forward jump is found in one step, not one per missed run."""

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        following: datetime | None = super().get_next_fire_time(previous_fire_time, now)
        if previous_fire_time is None or following is None or following > now:
            return following
        interval = timedelta(seconds=self.interval_length)
        missed = math.floor((now - following) / interval) + 1
        return following + missed * interval


def tick_scheduler(loop: asyncio.AbstractEventLoop) -> AsyncIOScheduler:
    """APScheduler's asyncio scheduler on `loop`: jobs in memory, run as tasks on the loop, timed in UTC."""
    return AsyncIOScheduler(
        event_loop=loop,
        jobstores={"default": MemoryJobStore()},
        executors={"default": AsyncIOExecutor()},
        timezone=UTC,
    )


def add_tick_job(scheduler: AsyncIOScheduler, job: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """The one job: never two ticks at once, missed runs coalesced into one, a late run still run (a late
    tick is better than none: `misfire_grace_time=None`)."""
    scheduler.add_job(
        job,
        SteadyInterval(seconds=interval_s),
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
        misfire_grace_time=None,
        id=TICK_JOB,
    )


class OnTime:
    """Keeps the tick on time across wall-clock jumps, by the monotonic clock, without a timer of its own.

    Every run of the tick job (an APScheduler event) logs a jump of the wall clock since the previous one and
    moves a monotonic deadline to one interval plus `WALL_JUMP_S` ahead; runs on time keep pushing it back, so
    it never fires. When it does, the tick is overdue: after a jump back APScheduler's next run lies in the
    future, and it is pulled in to now (then the deadline is set again, in case the jump was not the cause).
    """

    def __init__(
        self,
        scheduler: AsyncIOScheduler,
        interval_s: float,
        logger: FilteringBoundLogger,
        *,
        loop: asyncio.AbstractEventLoop,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scheduler = scheduler
        self._interval_s = interval_s
        self._log = logger
        self._loop = loop
        self._wall_clock = wall_clock
        self._clock = clock
        self._offset_s = wall_clock() - clock()
        self._deadline: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._scheduler.add_listener(self._on_time, ON_TIME_EVENTS)
        self._arm()

    def stop(self) -> None:
        self._scheduler.remove_listener(self._on_time)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_time(self, event: JobSubmissionEvent) -> None:
        if event.job_id == TICK_JOB:
            self._note_jump()
            self._arm()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()  # a cancelled timer is dropped by the loop, never woken for
        self._deadline = self._loop.call_later(self._interval_s + WALL_JUMP_S, self._overdue)

    def _note_jump(self) -> None:
        offset_s = self._wall_clock() - self._clock()
        if abs(offset_s - self._offset_s) > WALL_JUMP_S:
            self._log.warning("wall_clock_jumped", jump_s=round(offset_s - self._offset_s, 1))
        self._offset_s = offset_s

    def _overdue(self) -> None:
        self._deadline = None
        self._note_jump()
        job = self._scheduler.get_job(TICK_JOB)
        if job is not None and job.next_run_time is not None:
            now = datetime.fromtimestamp(self._wall_clock(), UTC)
            ahead_s = (job.next_run_time - now).total_seconds()
            if ahead_s > self._interval_s + WALL_JUMP_S:  # never more than one interval ahead unless it went back
                self._scheduler.modify_job(TICK_JOB, next_run_time=now)
        self._arm()
