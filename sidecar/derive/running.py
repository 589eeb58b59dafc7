"""A counter's increase over a sliding window, kept as a running sum where that is exact. Pure.

`counter.increase` adds each step in order, in floating point, over every reading in the window: each tick
rescanned minutes of history per engine. Counters are whole numbers (tokens, preemptions), and when every
reading in the window is a whole number from 0 to 2**53, every step and every partial sum is a whole number a
float holds exactly: a running sum kept in Python integers then gives the very same float as adding the steps
in order. Any other window (a fraction, a negative value, a sum past 2**53) is added up step by step as before.
"""

from __future__ import annotations

from bisect import bisect_left

from sidecar.derive.counter import increase

_EXACT_LIMIT = 2**53


def _whole(value: float) -> bool:
    return 0 <= value < _EXACT_LIMIT and float(value).is_integer()


class CounterSteps:
    """One counter's readings, each at a position (its snapshot's number), with running sums of its steps."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.times: list[float] = []
        self.values: list[float] = []
        self._whole: list[bool] = []
        self._sums: list[int] = []  # steps up to each reading, added as integers (meaningful where all whole)
        self._broken: list[int] = []  # readings so far that are not whole: a window must hold none

    def __len__(self) -> int:
        return len(self.values)

    def add(self, position: int, time_s: float, value: float) -> None:
        whole = _whole(value)
        step = 0
        if self.values and whole and self._whole[-1]:
            previous = self.values[-1]
            step = int(value - previous) if value >= previous else int(value)  # Prometheus' reset rule
        self.positions.append(position)
        self.times.append(time_s)
        self.values.append(value)
        self._whole.append(whole)
        self._sums.append((self._sums[-1] if self._sums else 0) + step)
        self._broken.append((self._broken[-1] if self._broken else 0) + (not whole))

    def drop_before(self, position: int) -> None:
        gone = bisect_left(self.positions, position)
        if gone:
            for kept in (self.positions, self.times, self.values, self._whole, self._sums, self._broken):
                del kept[:gone]

    def first_at(self, position: int) -> int:
        """Index of the first reading at `position` or later."""
        return bisect_left(self.positions, position)

    def increase_from(self, first: int) -> float:
        """`increase(self.values[first:])`, exactly, without walking the readings when they are all whole."""
        if first < len(self.values) and self._whole[first] and self._broken[-1] == self._broken[first]:
            total = self._sums[-1] - self._sums[first]
            if total < _EXACT_LIMIT:  # every step is >= 0, so no partial sum is larger
                return float(total)
        return increase(self.values[first:])
