"""The tick's schedule with a real APScheduler on an event loop running on virtual time (looptime): on time, the
watch quiet while it is, a wall-clock jump back pulled in within an interval and a second, a jump forward
skipped in one step. tests/chaos/test_clock_jumps.py jumps a real clock under the real daemon.

APScheduler times its jobs by `datetime.now`; here that reads a virtual wall clock, the loop's time plus a
shift the test moves (an NTP step), so the loop's monotonic clock and the scheduler's wall clock can disagree
as they do on a real host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

import apscheduler.schedulers.base
import pytest
import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from structlog.testing import capture_logs

import sidecar.shell.schedule
from sidecar.shell.schedule import TICK_JOB, WALL_JUMP_S, OnTime, SteadyInterval, add_tick_job, tick_scheduler

INTERVAL_S = 2.0
EPOCH_S = 1_790_000_000.0  # the virtual wall clock at loop time 0 (2026)
HOUR_S = 3600.0
TWENTY_YEARS_S = 20 * 365 * 86400.0

pytestmark = pytest.mark.looptime


@dataclass
class VirtualWall:
    """The wall clock as the running loop's time plus `shift_s`."""

    shift_s: float = 0.0

    def time(self) -> float:
        return EPOCH_S + asyncio.get_running_loop().time() + self.shift_s


@dataclass
class Schedule:
    scheduler: AsyncIOScheduler
    wall: VirtualWall
    watch: OnTime | None
    ticks: list[float] = field(default_factory=list)  # loop times the job started at
    overdue_looks: int = 0  # the watch's deadline fired (it looks the job up)
    running: int = 0
    most_running: int = 0


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> VirtualWall:
    """APScheduler's and add_tick_job's `datetime.now` read the virtual wall clock."""
    clock = VirtualWall()

    class VirtualDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> VirtualDatetime:
            return cls.fromtimestamp(clock.time(), tz)

    monkeypatch.setattr(apscheduler.schedulers.base, "datetime", VirtualDatetime)
    monkeypatch.setattr(sidecar.shell.schedule, "datetime", VirtualDatetime)
    return clock


@contextlib.asynccontextmanager
async def running(wall: VirtualWall, *, watched: bool = True, job_s: float = 0.0) -> AsyncIterator[Schedule]:
    """The tick job on a started scheduler, watched by `OnTime` unless `watched=False`; shut down after."""
    loop = asyncio.get_running_loop()
    scheduler = tick_scheduler(loop)
    watch = OnTime(scheduler, INTERVAL_S, structlog.get_logger(), loop=loop, wall_clock=wall.time, clock=loop.time)
    schedule = Schedule(scheduler, wall, watch if watched else None)
    get_job = scheduler.get_job

    def looked_up(job_id: str) -> object:
        schedule.overdue_looks += 1
        return get_job(job_id)

    scheduler.get_job = looked_up

    async def job() -> None:
        schedule.ticks.append(loop.time())
        schedule.running += 1
        schedule.most_running = max(schedule.most_running, schedule.running)
        await asyncio.sleep(job_s)
        schedule.running -= 1

    add_tick_job(scheduler, job, INTERVAL_S)
    scheduler.start()
    if schedule.watch is not None:
        schedule.watch.start()
    try:
        yield schedule
    finally:
        if schedule.watch is not None:
            schedule.watch.stop()
        scheduler.shutdown(wait=False)


def gaps(ticks: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(ticks)]


async def test_ticks_come_every_interval_and_the_watch_never_fires_while_they_do(wall: VirtualWall) -> None:
    async with running(wall) as schedule:
        with capture_logs() as logs:
            await asyncio.sleep(100 * INTERVAL_S + 0.5)

    assert len(schedule.ticks) == 101
    assert schedule.ticks[0] == pytest.approx(0.0, abs=1e-3)
    assert set(gaps(schedule.ticks)) == {INTERVAL_S}
    assert schedule.overdue_looks == 0
    assert logs == []


async def test_a_jump_back_is_logged_once_and_the_tick_comes_within_an_interval_and_a_second(
    wall: VirtualWall,
) -> None:
    async with running(wall) as schedule:
        await asyncio.sleep(4 * INTERVAL_S + 0.5)
        with capture_logs() as logs:
            wall.shift_s = -2 * HOUR_S
            await asyncio.sleep(10 * INTERVAL_S)

    assert gaps(schedule.ticks)[:4] == [INTERVAL_S] * 4
    # APScheduler's next run now lies 2 h ahead; the watch's deadline (an interval and a second after the last
    # run, by the loop's monotonic clock) pulls it in, and the interval holds from there.
    assert gaps(schedule.ticks)[4] == INTERVAL_S + WALL_JUMP_S
    assert set(gaps(schedule.ticks)[5:]) == {INTERVAL_S}
    assert len(schedule.ticks) == 5 + 9
    assert schedule.overdue_looks == 1
    assert [(entry["event"], entry["jump_s"]) for entry in logs] == [("wall_clock_jumped", -2 * HOUR_S)]


async def test_without_the_watch_a_jump_back_stalls_the_schedule_for_as_long_as_the_jump(wall: VirtualWall) -> None:
    """What the watch is for, shown on the same harness: APScheduler alone waits out the jump."""
    async with running(wall, watched=False) as schedule:
        await asyncio.sleep(4 * INTERVAL_S + 0.5)
        wall.shift_s = -2 * HOUR_S
        await asyncio.sleep(HOUR_S)
        assert len(schedule.ticks) == 5
        await asyncio.sleep(HOUR_S + 2 * INTERVAL_S)

    assert len(schedule.ticks) > 5
    assert gaps(schedule.ticks)[4] == pytest.approx(2 * HOUR_S + INTERVAL_S, abs=1.0)


async def test_a_jump_of_twenty_years_forward_keeps_the_interval_and_is_logged(wall: VirtualWall) -> None:
    async with running(wall) as schedule:
        await asyncio.sleep(4 * INTERVAL_S + 0.5)
        with capture_logs() as logs:
            wall.shift_s = TWENTY_YEARS_S
            await asyncio.sleep(10 * INTERVAL_S)

    assert set(gaps(schedule.ticks)) == {INTERVAL_S}  # one run for the missed 20 years (coalesced), then on time
    assert len(schedule.ticks) == 5 + 10
    assert schedule.overdue_looks == 0
    assert [(entry["event"], entry["jump_s"]) for entry in logs] == [("wall_clock_jumped", TWENTY_YEARS_S)]


def test_the_trigger_finds_the_next_run_after_twenty_years_in_one_step() -> None:
    """APScheduler asks the trigger again until the answer lies after `now`: one answer means one step."""
    trigger = SteadyInterval(seconds=INTERVAL_S)
    previous = datetime.fromtimestamp(EPOCH_S, UTC)
    now = previous + timedelta(seconds=TWENTY_YEARS_S + 0.5)

    following = trigger.get_next_fire_time(previous, now)

    assert following is not None
    assert now < following <= now + timedelta(seconds=INTERVAL_S)
    assert (following - previous).total_seconds() % INTERVAL_S == 0  # on the same grid
    assert trigger.get_next_fire_time(previous, previous) == previous + timedelta(seconds=INTERVAL_S)
    assert trigger.get_next_fire_time(None, now) is not None  # the first run: APScheduler's own answer


async def test_a_tick_longer_than_the_interval_never_overlaps_and_the_watch_stays_quiet(wall: VirtualWall) -> None:
    async with running(wall, job_s=2.5 * INTERVAL_S) as schedule:
        await asyncio.sleep(20 * INTERVAL_S)

    assert schedule.most_running == 1
    # due every interval; the runs that come due while one still runs are skipped (max_instances=1), and those
    # skips count as the scheduler being on time: the watch never pulls a run in
    assert set(gaps(schedule.ticks)) == {3 * INTERVAL_S}
    assert schedule.overdue_looks == 0


async def test_an_overdue_tick_is_looked_for_and_stop_ends_the_watch() -> None:
    loop = asyncio.get_running_loop()
    scheduler = tick_scheduler(loop)  # never started: no tick ever comes
    asked: list[str] = []
    scheduler.get_job = asked.append
    watch = OnTime(scheduler, INTERVAL_S, structlog.get_logger(), loop=loop, clock=loop.time)
    watch.start()
    await asyncio.sleep(INTERVAL_S + WALL_JUMP_S + 0.1)
    assert asked == [TICK_JOB]  # overdue once, and armed again
    await asyncio.sleep(INTERVAL_S + WALL_JUMP_S)
    assert asked == [TICK_JOB, TICK_JOB]
    watch.stop()
    await asyncio.sleep(10 * (INTERVAL_S + WALL_JUMP_S))
    assert asked == [TICK_JOB, TICK_JOB]
