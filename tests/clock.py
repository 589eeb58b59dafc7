"""The tests' one virtual clock: time that moves only when a test (or the code's own sleep) moves it.

Hand `clock` where the code takes a `clock=` and `clock.sleep` where it takes a `sleep=`: a wait of a minute
then takes no wall time, and the test reads exactly how long the code waited.
"""

from __future__ import annotations

import asyncio


class VirtualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []  # every sleep the code asked for, in order

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Moves the clock instead of waiting; yields once, as a real sleep lets other tasks run."""
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
