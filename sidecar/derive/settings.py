"""The knobs of derivation, passed explicitly (no global settings in the pure core)."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.bounds import Annotated, Ge, Gt, Le, first_violation

# Each field's range is on its type, written once: checked here, and read by the daemon's flags and their help.
Window = Annotated[float, Gt(0), Le(86400)]
Share = Annotated[float, Ge(0), Le(1)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeriveSettings:
    window_s: Window = 300.0  # prefix-cache hit ratio, preemptions and vLLM's rejections counted over the window
    # The short horizon, in polls, of the rates the policy judges (preemptions) and of vLLM's rejection rate: the
    # increase over the last 5 poll intervals (10 s at the default 2 s interval). Counted in polls, not seconds,
    # so it follows --interval without a setting of its own: long enough that one engine step's burst is not a
    # storm (a rate of 1/s needs more than 5 preemptions in 5 polls), short enough that a pause for it ends within
    # 5 polls of the storm's end (a 300 s average held /readyz at 503 for 158 s after the load had ended).
    short_horizon_polls: Annotated[int, Ge(1)] = 5  # a rate needs two polls
    memory_trend_window_s: Window = 600.0  # least-squares growth of GPU memory
    min_trend_points: Annotated[int, Ge(2)] = 6
    min_trend_span_s: Annotated[float, Gt(0)] = 30.0
    min_trend_r2: Share = 0.5  # below this the line explains too little of the variation to forecast from
    gpu_memory_utilization: Annotated[float, Gt(0), Le(1)] | None = None  # overrides vLLM's cache_config_info

    def __post_init__(self) -> None:
        violation = first_violation(self)
        if violation is not None:
            raise ValueError(violation)

    @property
    def span_s(self) -> float:
        """How much history the window must keep for every derivation."""
        return max(self.window_s, self.memory_trend_window_s)
