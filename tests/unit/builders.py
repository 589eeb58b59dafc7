"""Small builders for model values, so tests state only what they are about."""

from __future__ import annotations

from typing import Any

from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading, ProcessOwner
from sidecar.model.health import HealthAnswer, HealthCheck
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.model.vllm import CacheConfig, EngineMetrics, MetricSchema, ModelMetrics, VllmReading

GIB = 2**30


def cache_config(**overrides: Any) -> CacheConfig:
    values: dict[str, Any] = {
        "num_gpu_blocks_server": 128,
        "engines_in_server": 1,
        "block_size_tokens": 32,
        "gpu_memory_utilization": 0.9,
        "enable_prefix_caching": True,
        "kv_cache_size_tokens": 4096,
    }
    values.update(overrides)
    return CacheConfig(**values)


def engine(**overrides: Any) -> EngineMetrics:
    values: dict[str, Any] = {
        "model_name": "m",
        "engine": "0",
        "kv_cache_usage_ratio": 0.5,
        "requests_running": 4.0,
        "requests_waiting": 0.0,
        "requests_swapped": None,
        "cache_config": cache_config(),
        "prefix_cache_queries_total": 0.0,
        "prefix_cache_hits_total": 0.0,
        "prefix_cache_hit_rate_gauge": None,
        "preemptions_total": 0.0,
        "prompt_tokens_total": 0.0,
        "generation_tokens_total": 0.0,
        "iterations_total": 0.0,
    }
    values.update(overrides)
    return EngineMetrics(**values)


def device(index: int = 0, *, used: int = 40 * GIB, total: int = 80 * GIB, **overrides: Any) -> GpuDevice:
    values: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "Test GPU",
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "memory_free_bytes": total - used,
        "utilization_ratio": 0.5,
        "temperature_celsius": 50.0,
        "processes": (GpuProcess(pid=10, used_memory_bytes=used, name="python", owner=ProcessOwner.VLLM),),
        "xid_errors_total": 0,
        "last_xid": None,
    }
    values.update(overrides)
    return GpuDevice(**values)


def snapshot(
    t: float,
    engines: tuple[EngineMetrics, ...] | None = None,
    *,
    devices: tuple[GpuDevice, ...] | None = None,
    vllm_error: str | None = None,
    unreachable: bool = False,
    healthy: bool | None = True,
    health: HealthAnswer | None = None,  # what /health answered, where a test needs more than `healthy`
    models: tuple[ModelMetrics, ...] = (),
    version: str | None = "0.32.0",
    schema: MetricSchema = MetricSchema.V1,
) -> Snapshot:
    vllm: SourceResult[VllmReading]
    if vllm_error is not None:
        vllm = SourceResult(source="vllm", duration_s=0.01, error=vllm_error, unreachable=unreachable)
    else:
        reading = VllmReading(
            url="http://vllm", version=version, schema=schema, engines=engines or (engine(),), models=models
        )
        vllm = SourceResult(source="vllm", duration_s=0.01, value=reading)
    gpu = None
    if devices is not None:
        gpu = SourceResult(source="nvml", duration_s=0.001, value=GpuReading(devices=devices, driver_version="1"))
    answered = None if health is None else HealthCheck(answer=health, detail=f"/health: {health}")
    return Snapshot(
        monotonic_s=t,
        wall_time_s=1_700_000_000 + t,
        vllm=vllm,
        vllm_healthy=healthy if health is None else health is HealthAnswer.OK,
        vllm_health=answered,
        gpu=gpu,
    )
