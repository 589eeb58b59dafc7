"""Everything the doctor was given, as read: vLLM live, the GPUs, the log, the sidecar's history. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.traffic import Traffic
from sidecar.model.gpu import GpuReading
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
class GpuTrend:
    """One GPU's memory trend as the sidecar daemon measured it over its window."""

    gpu: int
    growth_bytes_per_second: float | None
    fit_r2: float | None
    time_to_oom_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryFacts:
    source: str
    prefix_hit_ratio_window: float | None  # the lowest engine's, over the daemon's window
    preemptions_per_second: float | None  # the highest engine's, over the last few polls (what the policy judges)
    gpus: tuple[GpuTrend, ...]
    restarts: tuple[tuple[str, int], ...]  # (reason, count) of the sidecar's restarts of vLLM


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    live: LiveEvidence
    gpu: GpuEvidence
    log: LogFacts | None
    log_path: str | None
    history: HistoryFacts | None
    problems: tuple[str, ...] = ()  # what could not be read, one line each
