"""The tick's schedule: APScheduler's one interval job, kept on time when the wall clock jumps. Reads both clocks.

APScheduler 3 times its jobs by the wall clock (`datetime.now`), which NTP steps, VM resumes and a host that
booted with a dead RTC move by minutes to decades. Left alone:
- a jump back of N seconds leaves the next run N seconds in the future: no poll, no policy, for as long as
  the jump (an NTP step back of an hour is an hour blind). `keep_on_time` checks against the monotonic clock
  every interval and pulls the next run in;
- a jump forward makes the interval trigger walk through every missed run one at a time to find the next one
  (20 years at 2 s: 3 x 10^8 steps, minutes of a frozen event loop and gigabytes of datetimes).
  `SteadyInterval` skips them in one step.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from structlog.typing import FilteringBoundLogger

TICK_JOB = "tick"
WALL_JUMP_S = 1.0  # a change of wall minus monotonic time bigger than this is a jump, not drift or slewing


class SteadyInterval(IntervalTrigger):  # type: ignore[misc] # apscheduler has no type hints: its classes are Any
    """An interval trigger whose next run after a forward jump is found in one step, not one per missed run."""

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        following: datetime | None = super().get_next_fire_time(previous_fire_time, now)
        if previous_fire_time is None or following is None or following > now:
            return following
        interval = timedelta(seconds=self.interval_length)
        missed = math.floor((now - following) / interval) + 1
        return following + missed * interval


def add_tick_job(scheduler: AsyncIOScheduler, job: Callable[[], Awaitable[None]], interval_s: float) -> None:
    """The one job: never two ticks at once, missed runs coalesced into one."""
    scheduler.add_job(
        job,
        SteadyInterval(seconds=interval_s),
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
        misfire_grace_time=None,
        id=TICK_JOB,
    )


async def keep_on_time(
    scheduler: AsyncIOScheduler,
    interval_s: float,
    logger: FilteringBoundLogger,
    *,
    wall_clock: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Every interval (by the monotonic clock): log a wall-clock jump, and after a jump back run the tick now."""
    offset_s = wall_clock() - clock()
    while True:
        await asyncio.sleep(interval_s)
        now_offset_s = wall_clock() - clock()
        if abs(now_offset_s - offset_s) > WALL_JUMP_S:
            logger.warning("wall_clock_jumped", jump_s=round(now_offset_s - offset_s, 1))
        offset_s = now_offset_s
        job = scheduler.get_job(TICK_JOB)
        if job is None or job.next_run_time is None:
            continue
        now = datetime.fromtimestamp(wall_clock(), UTC)
        ahead_s = (job.next_run_time - now).total_seconds()
        if ahead_s > interval_s + WALL_JUMP_S:  # never more than one interval ahead unless the clock went back
            scheduler.modify_job(TICK_JOB, next_run_time=now)
