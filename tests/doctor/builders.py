"""Builders for the doctor's evidence, so each rule test states only the numbers it is about."""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sidecar.doctor.evidence import Evidence, GpuEvidence, HistoryFacts, LiveEvidence
from sidecar.doctor.histogram import E2E_LATENCY, GENERATION_TOKENS, MAX_TOKENS_PARAM, PROMPT_TOKENS, Histogram
from sidecar.doctor.logfacts import LogFacts, ServerArgs
from sidecar.doctor.traffic import Traffic
from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading, ProcessOwner
from sidecar.model.status import EngineStatus, GpuStatus, StatusDocument
from sidecar.model.vllm import EngineMetrics, MetricSchema, VllmReading
from tests.unit.builders import cache_config, engine

GIB = 2**30
TOKEN_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
LATENCY_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)

__all__ = ["GIB", "cache_config", "engine"]


def histogram(family: str, observations: Sequence[float], bounds: Sequence[float] = TOKEN_BOUNDS) -> Histogram:
    """What vLLM would expose after observing `observations` (le buckets are inclusive)."""
    buckets = tuple((float(b), float(sum(1 for o in observations if o <= b))) for b in (*bounds, math.inf))
    return Histogram(family=family, count=len(observations), sum=float(sum(observations)), buckets=buckets)


def traffic(
    prompts: Sequence[float],
    outputs: Sequence[float],
    *,
    latencies: Sequence[float] | None = None,
    max_tokens: Sequence[float] | None = None,
) -> Traffic:
    return Traffic(
        prompt=histogram(PROMPT_TOKENS, prompts),
        generation=histogram(GENERATION_TOKENS, outputs),
        max_tokens=histogram(MAX_TOKENS_PARAM, max_tokens) if max_tokens is not None else None,
        e2e_latency=histogram(E2E_LATENCY, latencies, LATENCY_BOUNDS) if latencies is not None else None,
    )


def reading(*engines: EngineMetrics, schema: MetricSchema = MetricSchema.V1) -> VllmReading:
    return VllmReading(url="http://vllm", version=None, schema=schema, engines=engines or (engine(),))


def live(
    *,
    version: str | None = "0.32.0",
    max_model_len: int | None = 4096,
    vllm: VllmReading | None = None,
    load: Traffic | None = None,
    error: str | None = None,
) -> LiveEvidence:
    return LiveEvidence(
        url="http://vllm",
        reachable=error is None,
        error=error,
        version=version,
        max_model_len=max_model_len,
        reading=vllm if vllm is not None or error is not None else reading(),
        traffic=load,
    )


def process(pid: int, used: int, name: str, owner: ProcessOwner) -> GpuProcess:
    return GpuProcess(pid=pid, used_memory_bytes=used, name=name, owner=owner)


def gpu(
    *,
    used: int,
    total: int = 80 * GIB,
    vllm: int | None = None,
    others: Sequence[tuple[int, int, str]] = (),
    name: str = "NVIDIA H100 80GB HBM3",
    index: int = 0,
) -> GpuDevice:
    other_processes = tuple(process(pid, size, label, ProcessOwner.OTHER) for pid, size, label in others)
    vllm_bytes = used - sum(size for _, size, _ in others) if vllm is None else vllm
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index}",
        name=name,
        memory_total_bytes=total,
        memory_used_bytes=used,
        memory_free_bytes=total - used,
        utilization_ratio=0.5,
        temperature_celsius=50.0,
        processes=(process(4242, vllm_bytes, "VLLM::EngineCore", ProcessOwner.VLLM), *other_processes),
        xid_errors_total=None,
        last_xid=None,
    )


def gpus(*devices: GpuDevice, source: str = "sim") -> GpuEvidence:
    return GpuEvidence(source=source, reading=GpuReading(devices=devices, driver_version="x"), error=None)


NO_GPU = GpuEvidence(source="none", reading=None, error=None)


def log(**facts: Any) -> LogFacts:
    return replace(LogFacts(lines_read=10, lines_recognised=5), **facts)


def args(**values: Any) -> ServerArgs:
    return ServerArgs(complete=False, **values)


def gpu_status(gpu: int = 0, **values: Any) -> GpuStatus:
    """One GPU of a /status document: 80 GiB, the rest unknown unless given (by the document's own keys)."""
    document: dict[str, Any] = dict.fromkeys(GpuStatus.__annotations__)
    document.update(gpu=gpu, memory_total_bytes=80 * 2**30, memory_used_bytes=0, memory_free_bytes=80 * 2**30)
    document.update({"processes": [], **values})
    return typing.cast("GpuStatus", document)  # every key set above


def engine_status(**values: Any) -> EngineStatus:
    """One engine of a /status document: engine 0 of model m, every value unknown unless given."""
    document: dict[str, Any] = dict.fromkeys(EngineStatus.__annotations__)
    document.update({"model_name": "m", "engine": "0", **values})
    return typing.cast("EngineStatus", document)  # every key set above


def status_document(
    *, gpus: Sequence[GpuStatus] = (), engines: Sequence[EngineStatus] = (), **parts: Any
) -> StatusDocument:
    document: dict[str, Any] = {
        "sidecar": {"version": "test", "last_poll_timestamp_seconds": None},
        "sources": {},
        "vllm": {"url": "http://vllm", "reachable": True, "healthy": True, "version": None, "metric_schema": None},
        "engines": list(engines),
        "gpus": list(gpus),
        "problems": [],
        "models": [],
        "allocators": [],
    }
    document.update(parts)
    return typing.cast("StatusDocument", document)  # every key set above


def history(
    *trends: GpuStatus, restarts: tuple[tuple[str, int], ...] = (), hit_ratio: float | None = None
) -> HistoryFacts:
    engines = [engine_status(prefix_cache_hit_ratio=hit_ratio)] if hit_ratio is not None else []
    return HistoryFacts(
        source="http://sidecar/status", restarts=restarts, status=status_document(gpus=trends, engines=engines)
    )


def evidence(
    *,
    live_evidence: LiveEvidence | None = None,
    gpu_evidence: GpuEvidence = NO_GPU,
    log_facts: LogFacts | None = None,
    history_facts: HistoryFacts | None = None,
) -> Evidence:
    return Evidence(
        live=live_evidence if live_evidence is not None else live(),
        gpu=gpu_evidence,
        log=log_facts,
        log_path="vllm.log" if log_facts is not None else None,
        history=history_facts,
    )
