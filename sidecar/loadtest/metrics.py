"""What a load test learns about the server while it runs: the peak KV-cache usage, the preemptions over
the run, and when the server was first seen down. Pure: readings and times come in as arguments.

Preemptions are counted per engine the way Prometheus' `increase()` does: a counter that goes down was
reset (the server restarted) and its new value is all increase, so a restart never gives a negative count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sidecar.model.vllm import EngineMetrics

EngineKey = tuple[str, str]


@dataclass(slots=True)
class ServerWatch:
    """Accumulates readings of vLLM's /metrics and signs that the server is down, over one run."""

    peak_kv_usage_ratio: float | None = None  # None: no reading had a KV-cache usage
    preemptions: float | None = None  # increase over the run; None: no reading had the counter
    down_at_s: float | None = None  # earliest time into the run the server was seen down
    down_reason: str | None = None
    metrics_readings: int = 0
    _last_preemptions: dict[EngineKey, float] = field(default_factory=dict)

    def observe_metrics(self, engines: Iterable[EngineMetrics]) -> None:
        """One successful read of /metrics: per-engine values, maximum KV usage over engines."""
        self.metrics_readings += 1
        for engine in engines:
            usage = engine.kv_cache_usage_ratio
            if usage is not None and (self.peak_kv_usage_ratio is None or usage > self.peak_kv_usage_ratio):
                self.peak_kv_usage_ratio = usage
            self._observe_preemptions((engine.model_name, engine.engine), engine.preemptions_total)

    def _observe_preemptions(self, key: EngineKey, total: float | None) -> None:
        if total is None:
            return
        previous = self._last_preemptions.get(key)
        self._last_preemptions[key] = total
        if self.preemptions is None:
            self.preemptions = 0.0
        if previous is None:
            return  # the baseline: what happened before the run is not the run's
        self.preemptions += total - previous if total >= previous else total

    def observe_down(self, at_s: float, reason: str) -> None:
        """A sign the server is down; the earliest one is kept (results arrive out of order)."""
        if self.down_at_s is None or at_s < self.down_at_s:
            self.down_at_s = at_s
            self.down_reason = reason

    @property
    def died(self) -> bool:
        return self.down_at_s is not None
