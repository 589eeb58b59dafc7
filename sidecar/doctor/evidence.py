"""Everything the doctor was given, as read: vLLM live, the GPUs, the log, the sidecar's history. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.traffic import Traffic
from sidecar.model.gpu import GpuReading
from sidecar.model.status import AllocatorStatus, EngineStatus, GpuStatus, PolicyStatus, StatusDocument
from sidecar.model.vllm import VllmReading


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveEvidence:
    url: str
    reachable: bool  # /metrics answered (even if what it said was unusable)
    error: str | None  # one line when /metrics could not be read or understood
    version: str | None  # GET /version
    max_model_len: int | None  # GET /v1/models
    reading: VllmReading | None
    traffic: Traffic | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuEvidence:
    source: str  # nvml, sim or none
    reading: GpuReading | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryFacts:
    """The sidecar daemon's history: its /status document, as its schema says (`sidecar.model.status`), or its
    restart ledger. The rules read the document's own keys: nothing is renamed on the way in."""

    source: str
    restarts: tuple[tuple[str, int], ...]  # (reason, count) of the sidecar's restarts of vLLM
    status: StatusDocument | None = None  # None: read from a restart ledger, which has none of it

    @property
    def engines(self) -> list[EngineStatus]:
        return self.status["engines"] if self.status is not None else []

    @property
    def gpus(self) -> list[GpuStatus]:
        return self.status["gpus"] if self.status is not None else []

    @property
    def allocators(self) -> list[AllocatorStatus]:
        return self.status["allocators"] if self.status is not None else []

    @property
    def policy(self) -> PolicyStatus | None:
        return self.status.get("policy") if self.status is not None else None

    @property
    def polled_at_s(self) -> float | None:
        """The daemon's last poll, wall-clock seconds."""
        return self.status["sidecar"].get("last_poll_timestamp_seconds") if self.status is not None else None

    @property
    def vllm_version(self) -> str | None:
        return self.status["vllm"]["version"] if self.status is not None else None

    @property
    def vllm_healthy(self) -> bool | None:
        return self.status["vllm"]["healthy"] if self.status is not None else None

    @property
    def prefix_hit_ratio_window(self) -> float | None:
        """The lowest engine's prefix-cache hit ratio over the daemon's window."""
        ratios = [engine["prefix_cache_hit_ratio"] for engine in self.engines]
        return min((ratio for ratio in ratios if ratio is not None), default=None)

    def engine_label(self, engine: EngineStatus) -> str:
        """`engine 0`, or `engine llama/0` when the history serves several models."""
        several = len({other["model_name"] for other in self.engines}) > 1
        return f"engine {engine['model_name']}/{engine['engine']}" if several else f"engine {engine['engine']}"


def counted(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """A counter map's non-zero entries, sorted: what happened, not every kind that could."""
    return tuple((name, count) for name, count in sorted(counts.items()) if count > 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    live: LiveEvidence
    gpu: GpuEvidence
    log: LogFacts | None
    log_path: str | None
    history: HistoryFacts | None
    problems: tuple[str, ...] = ()  # what could not be read, one line each
