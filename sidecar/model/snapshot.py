"""One tick's observations from every source, stamped with the sidecar's clocks. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model.allocator import AllocatorReading
from sidecar.model.gpu import GpuReading
from sidecar.model.health import HealthAnswer, HealthCheck
from sidecar.model.source import SourceResult
from sidecar.model.supervision import Supervision
from sidecar.model.vllm import VllmReading


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    monotonic_s: float  # for windows and rates: never jumps
    wall_time_s: float  # only for exported timestamps
    vllm: SourceResult[VllmReading]
    vllm_healthy: bool | None  # /health answered 200; None when it was not asked
    gpu: SourceResult[GpuReading] | None  # None when no GPU source is configured
    # What /health answered, for readiness's reason line; None when not asked (recordings, tests that only
    # need the verdict above, which always agrees with it).
    vllm_health: HealthCheck | None = None
    allocator: SourceResult[AllocatorReading] | None = None  # None when no --probe-dir is configured
    # Who restarts vLLM, asked of the restart adapter while nothing listens at vLLM's address; None otherwise.
    vllm_supervision: Supervision | None = None

    @property
    def vllm_slow(self) -> bool:
        """/health gave no answer in time (a timeout, a reset): a loaded vLLM can be this slow. No sign that it
        restarted: a new process shows as nothing listening while it loads, and its counters start from zero."""
        return self.vllm_health is not None and self.vllm_health.answer is HealthAnswer.NO_ANSWER
