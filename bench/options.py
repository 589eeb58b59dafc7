"""What `python -m bench` was asked to measure, as every suite reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    repeats: int
    tick_seconds: float
    tick_serial: bool
    reaction_trials: int
    reaction_intervals: tuple[float, ...]
    scenarios: tuple[str, ...]
    efficacy_scale: float
    recovery_trials: int = 3
