"""The tick's schedule on a real event loop with a real APScheduler: on time, cheap between ticks, and pulled
back in when the wall clock jumps back (simulated here by APScheduler's next run moved an hour ahead, which is
what its wall-clock timing sees after such a jump; tests/chaos/test_clock_jumps.py jumps a real clock)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import structlog
from structlog.testing import capture_logs

from sidecar.shell.schedule import TICK_JOB, WALL_JUMP_S, LoopScheduler, OnTime, add_tick_job

INTERVAL_S = 0.1


class Ticks:
    def __init__(self, on_time: list[OnTime]) -> None:
        self.at: list[float] = []
        self._on_time = on_time

    async def job(self) -> None:
        for watch in self._on_time:
            watch.tick_started()
        self.at.append(time.monotonic())


async def _wait_for(predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_the_timer_runs_the_job_on_the_loop_without_the_thread_safe_hop() -> None:
    loop = asyncio.get_running_loop()
    scheduler = LoopScheduler(event_loop=loop)
    ticks = Ticks([])
    add_tick_job(scheduler, ticks.job, INTERVAL_S)
    scheduler.start()
    try:
        await _wait_for(lambda: len(ticks.at) >= 2, 5)
        hops = 0
        original = loop.call_soon_threadsafe

        def counting(*args: object, **kwargs: object) -> asyncio.Handle:
            nonlocal hops
            hops += 1
            return original(*args, **kwargs)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        before = len(ticks.at)
        await _wait_for(lambda: len(ticks.at) >= before + 5, 5)
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        assert hops == 0  # AsyncIOScheduler's own wakeup would hop once a tick
        gaps = [b - a for a, b in zip(ticks.at, ticks.at[1:], strict=False)]
        assert all(0.5 * INTERVAL_S < gap < 5 * INTERVAL_S for gap in gaps[1:]), gaps
        # Calls from outside the timer still go through APScheduler's thread-safe path and still work.
        scheduler.modify_job(TICK_JOB, next_run_time=datetime.now(UTC) + timedelta(hours=1))
        await asyncio.sleep(3 * INTERVAL_S)
        stopped_at = len(ticks.at)
        await asyncio.sleep(3 * INTERVAL_S)
        assert len(ticks.at) == stopped_at
    finally:
        scheduler.shutdown(wait=False)


async def test_a_schedule_pushed_an_hour_ahead_is_pulled_back_within_an_interval_and_a_second() -> None:
    loop = asyncio.get_running_loop()
    scheduler = LoopScheduler(event_loop=loop)
    watch = OnTime(scheduler, INTERVAL_S, structlog.get_logger(), loop=loop)
    ticks = Ticks([watch])
    add_tick_job(scheduler, ticks.job, INTERVAL_S)
    scheduler.start()
    watch.start()
    try:
        await _wait_for(lambda: len(ticks.at) >= 3, 5)
        scheduler.modify_job(TICK_JOB, next_run_time=datetime.now(UTC) + timedelta(hours=1))
        await asyncio.sleep(0.05)  # the modification is applied on the loop
        held = len(ticks.at)
        held_at = time.monotonic()
        await _wait_for(lambda: len(ticks.at) > held, 5)
        late_s = ticks.at[held] - held_at
        assert late_s <= INTERVAL_S + WALL_JUMP_S + 0.5, late_s
        await _wait_for(lambda: len(ticks.at) >= held + 3, 5)  # and it keeps its interval afterwards
    finally:
        watch.stop()
        scheduler.shutdown(wait=False)


async def test_ticks_on_time_never_let_the_deadline_fire_and_a_wall_jump_is_logged_once() -> None:
    loop = asyncio.get_running_loop()
    scheduler = LoopScheduler(event_loop=loop)
    shift_s = 0.0
    watch = OnTime(scheduler, INTERVAL_S, structlog.get_logger(), loop=loop, wall_clock=lambda: time.time() + shift_s)
    fired = 0
    overdue = watch._overdue

    def counting_overdue() -> None:
        nonlocal fired
        fired += 1
        overdue()

    watch._overdue = counting_overdue  # type: ignore[method-assign]
    ticks = Ticks([watch])
    add_tick_job(scheduler, ticks.job, INTERVAL_S)
    scheduler.start()
    watch.start()
    try:
        with capture_logs() as logs:
            await _wait_for(lambda: len(ticks.at) >= 5, 5)
            shift_s = -7200.0
            seen = len(ticks.at)
            await _wait_for(lambda: len(ticks.at) >= seen + 3, 5)
        assert fired == 0
        jumps = [entry for entry in logs if entry["event"] == "wall_clock_jumped"]
        assert [round(float(entry["jump_s"])) for entry in jumps] == [-7200]
    finally:
        watch.stop()
        scheduler.shutdown(wait=False)


async def test_an_overdue_tick_is_looked_for_and_stop_ends_the_watch() -> None:
    loop = asyncio.get_running_loop()
    scheduler = LoopScheduler(event_loop=loop)  # never started: no tick ever comes
    asked: list[str] = []
    scheduler.get_job = asked.append
    watch = OnTime(scheduler, INTERVAL_S, structlog.get_logger(), loop=loop)
    watch.start()
    await asyncio.sleep(INTERVAL_S + WALL_JUMP_S + 0.3)
    assert asked == [TICK_JOB]  # overdue once, and armed again
    watch.stop()
    await asyncio.sleep(INTERVAL_S + WALL_JUMP_S + 0.3)
    assert asked == [TICK_JOB]
