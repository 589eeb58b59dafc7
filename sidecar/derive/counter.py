"""Counter arithmetic the way Prometheus does it: a decrease is a reset, not a negative change. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise


def increase(values: Sequence[float]) -> float:
    """Total increase over consecutive readings of one counter, counting through resets.

    As in Prometheus' `increase()` (without its extrapolation): after a reset the counter restarted from
    zero, so its new value is all increase.
    """
    total = 0.0
    for previous, current in pairwise(values):
        total += current - previous if current >= previous else current
    return total
