"""The knobs of derivation, passed explicitly (no global settings in the pure core)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class DeriveSettings:
    window_s: float = 300.0  # prefix-cache hit ratio and preemption rate
    memory_trend_window_s: float = 600.0  # least-squares growth of GPU memory
    min_trend_points: int = 6
    min_trend_span_s: float = 30.0
    min_trend_r2: float = 0.5  # below this the line explains too little of the variation to forecast from
    gpu_memory_utilization: float | None = None  # overrides vLLM's own cache_config_info value

    @property
    def span_s(self) -> float:
        """How much history the window must keep for every derivation."""
        return max(self.window_s, self.memory_trend_window_s)
