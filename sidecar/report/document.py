"""Builds the `once --json` and `/status` documents from snapshots and derived values. Pure.

The shapes are part of the public contract (`sidecar/model/status.py` holds them, for this writer and the doctor
that reads them back): a value that cannot be known is `null`, never 0.
"""

from __future__ import annotations

import math

from sidecar.model.acting import ActingView, RemediationView
from sidecar.model.cause import CrashCause
from sidecar.model.derived import AllocatorDerived, Derived, EngineDerived, GpuDerived, ModelDerived
from sidecar.model.gpu import GpuDevice
from sidecar.model.snapshot import Snapshot
from sidecar.model.status import (
    AllocatorStatus,
    CrashCauseStatus,
    EngineOnce,
    EngineStatus,
    GpuStatus,
    ModelOnce,
    ModelStatus,
    OnceDocument,
    PolicyStatus,
    RemediationStatus,
    StatusDocument,
    VllmStatus,
)


def finite(document: object) -> object:
    """JSON has no NaN or infinity: an unknowable number is null."""
    if isinstance(document, float) and not math.isfinite(document):
        return None
    if isinstance(document, dict):
        return {key: finite(value) for key, value in document.items()}
    if isinstance(document, list):
        return [finite(value) for value in document]
    return document


def count(value: float | None) -> int | float | None:
    """Request counts arrive as Prometheus floats; show whole numbers as integers."""
    return int(value) if value is not None and value.is_integer() else value


def vllm_document(snapshot: Snapshot, url: str) -> VllmStatus:
    reading = snapshot.vllm.value if snapshot.vllm.error is None else None
    return {
        "url": url,
        "reachable": reading is not None,
        "healthy": snapshot.vllm_healthy,
        "version": reading.version if reading is not None else None,
        "metric_schema": reading.schema.value if reading is not None else None,
    }


def engine_once_document(engine: EngineDerived) -> EngineOnce:
    """The instantaneous values of one engine: what a single poll can know."""
    return {
        "model_name": engine.model_name,
        "engine": engine.engine,
        "kv_cache_usage_ratio": engine.kv_cache_usage_ratio,
        "kv_cache_capacity_blocks": engine.kv_cache_capacity_blocks,
        "kv_cache_block_size_tokens": engine.kv_cache_block_size_tokens,
        "kv_cache_used_blocks": engine.kv_cache_used_blocks,
        "requests_running": count(engine.requests_running),
        "requests_waiting": count(engine.requests_waiting),
        "kv_cache_blocks_per_request": engine.kv_cache_blocks_per_request,
        "kv_cache_request_headroom": engine.kv_cache_request_headroom,
        "kv_cache_fragmentation_ratio": engine.kv_cache_fragmentation_ratio,
        "prefix_cache_hit_ratio_lifetime": engine.prefix_cache_hit_ratio_lifetime,
        # Beyond the contract's fields: vLLM's queue split (0.20+), its fault tolerance's verdict, token capacity.
        "requests_waiting_capacity": count(engine.requests_waiting_capacity),
        "requests_waiting_deferred": count(engine.requests_waiting_deferred),
        "engine_healthy": engine.engine_healthy,
        "kv_cache_capacity_tokens": engine.kv_cache_capacity_tokens,
        "kv_cache_free_blocks": engine.kv_cache_free_blocks,
    }


def engine_status_document(engine: EngineDerived) -> EngineStatus:
    return EngineStatus(
        **engine_once_document(engine),
        prefix_cache_hit_ratio=engine.prefix_cache_hit_ratio,
        preemptions_per_second=engine.preemptions_per_second,
        engine_stalled_seconds=engine.engine_stalled_seconds,
        preemptions_in_window=count(engine.preemptions_in_window),
        requests_waiting_deferred_ratio=engine.requests_waiting_deferred_ratio,
        engine_unhealthy_seconds=engine.engine_unhealthy_seconds,
        seconds_since_progress=engine.seconds_since_progress,
    )


def model_once_document(model: ModelDerived) -> ModelOnce:
    """vLLM's own admission control for one served model (0.32+): what a single poll can know."""
    return {
        "model_name": model.model_name,
        "admission_rejections_total": count(model.admission_rejections_total),
        "admission_rejections_by_reason": {
            reason: count(value) for reason, value in model.admission_rejections_by_reason
        },
    }


def model_status_document(model: ModelDerived) -> ModelStatus:
    return ModelStatus(
        **model_once_document(model),
        admission_rejections_per_second=model.admission_rejections_per_second,
        admission_rejections_in_window=count(model.admission_rejections_in_window),
    )


def gpu_document(gpu: GpuDerived, device: GpuDevice | None) -> GpuStatus:
    return GpuStatus(
        gpu=gpu.gpu,
        uuid=device.uuid if device is not None else None,
        name=device.name if device is not None else None,
        memory_total_bytes=gpu.memory_total_bytes,
        memory_used_bytes=gpu.memory_used_bytes,
        memory_free_bytes=gpu.memory_free_bytes,
        memory_budget_bytes=gpu.memory_budget_bytes,
        memory_over_budget_bytes=gpu.memory_over_budget_bytes,
        memory_growth_bytes_per_second=gpu.memory_growth_bytes_per_second,
        memory_growth_fit_r2=gpu.memory_growth_fit_r2,
        time_to_oom_seconds=gpu.time_to_oom_seconds,
        vllm_process_memory_bytes=gpu.vllm_process_memory_bytes,
        other_process_memory_bytes=gpu.other_process_memory_bytes,
        unknown_process_memory_bytes=gpu.unknown_process_memory_bytes,
        utilization_ratio=gpu.utilization_ratio,
        temperature_celsius=gpu.temperature_celsius,
        xid_errors_total=gpu.xid_errors_total,
        last_xid=gpu.last_xid,
        processes=[
            {"pid": p.pid, "name": p.name, "owner": p.owner.value, "used_memory_bytes": p.used_memory_bytes}
            for p in (device.processes if device is not None else ())
        ],
    )


def once_document(snapshot: Snapshot, derived: Derived, url: str) -> OnceDocument:
    devices = _devices(snapshot)
    return {
        "vllm": vllm_document(snapshot, url),
        "engines": [engine_once_document(engine) for engine in derived.engines],
        "gpus": [gpu_document(gpu, devices.get(gpu.gpu)) for gpu in derived.gpus],
        "problems": list(derived.problems),
        "models": [model_once_document(model) for model in derived.models],
        "allocators": [_allocator(allocator) for allocator in derived.allocators],
    }


def _allocator(allocator: AllocatorDerived) -> AllocatorStatus:
    return AllocatorStatus(
        gpu=allocator.gpu,
        rank=allocator.rank,
        processes=allocator.processes,
        allocated_bytes=allocator.allocated_bytes,
        reserved_bytes=allocator.reserved_bytes,
        inactive_split_bytes=allocator.inactive_split_bytes,
        fragmentation_ratio=allocator.fragmentation_ratio,
        alloc_retries_total=allocator.alloc_retries_total,
        ooms_total=allocator.ooms_total,
        alloc_retries_recent=allocator.alloc_retries_recent,
        ooms_recent=allocator.ooms_recent,
    )


def status_document(snapshot: Snapshot, derived: Derived, url: str, *, version: str) -> StatusDocument:
    devices = _devices(snapshot)
    return {
        "sidecar": {"version": version, "last_poll_timestamp_seconds": snapshot.wall_time_s},
        "sources": {
            result.source: {"ok": result.ok, "duration_seconds": result.duration_s, "error": result.error}
            for result in (snapshot.vllm, snapshot.gpu, snapshot.allocator)
            if result is not None
        },
        "vllm": vllm_document(snapshot, url),
        "engines": [engine_status_document(engine) for engine in derived.engines],
        "gpus": [gpu_document(gpu, devices.get(gpu.gpu)) for gpu in derived.gpus],
        "problems": list(derived.problems),
        "models": [model_status_document(model) for model in derived.models],
        "allocators": [_allocator(allocator) for allocator in derived.allocators],
    }


def _devices(snapshot: Snapshot) -> dict[int, GpuDevice]:
    if snapshot.gpu is None or snapshot.gpu.value is None:
        return {}
    return {device.index: device for device in snapshot.gpu.value.devices}


def policy_document(acting: ActingView) -> PolicyStatus:
    """The policy part of /status: state, why, guards, counters, recent decisions. Never a secret."""
    return {
        "state": acting.state,
        "admission_paused": acting.admission_paused,
        "ready": acting.ready,
        "readiness": acting.readiness_reason,
        "reason": acting.decision_reason,
        "would_restart_but": acting.would_restart_but,
        "cooldown_remaining_seconds": acting.cooldown_remaining_s,
        "restarts_in_budget_window": acting.restarts_in_budget_window,
        "restart_budget_remaining": acting.restart_budget_remaining,
        "last_restart_timestamp_seconds": acting.last_restart_wall_time_s,
        "dry_run": acting.dry_run,
        "actuator": acting.actuator,
        "actions": acting.actions,
        "failures": acting.failures,
        "restarts": acting.restarts,
        "recent": list(acting.recent),
        "probes": acting.probes,
        "last_probe": acting.last_probe,
        "last_probe_duration_seconds": acting.last_probe_duration_s,
        "crash_cause": _crash_cause_document(acting.crash_cause),
        "last_incident": None
        if acting.last_incident is None
        else {
            "path": acting.last_incident.path,
            "cause": acting.last_incident.cause,
            "timestamp_seconds": acting.last_incident.wall_time_s,
        },
        "remediation": _remediation_document(acting.remediation),
    }


def _remediation_document(view: RemediationView | None) -> RemediationStatus | None:
    if view is None:
        return None
    return {
        "allowed": [allowance.words() for allowance in view.allowed],
        "flags_file": view.flags_file,
        "flags": dict(view.flags),
        "steps": [
            {
                "flag": step.flag,
                "change": step.diff(),
                "before": step.before,
                "after": step.after,
                "cause": step.cause,
                "why": step.why,
                "state": str(step.state),
                "outcome": step.outcome,
                "timestamp_seconds": step.wall_time_s,
                "resolved_timestamp_seconds": step.resolved_wall_time_s,
                "held": step.held,
            }
            for step in view.steps
        ],
        "last_refusal": view.last_refusal,
        "problem": view.problem,
    }


def _crash_cause_document(cause: CrashCause | None) -> CrashCauseStatus | None:
    """Why vLLM last died as its log said (cause null: unknown, and the summary says why); null: never read."""
    if cause is None:
        return None
    return {
        "cause": cause.cause,
        "severity": cause.severity,
        "summary": cause.summary,
        "evidence": list(cause.evidence),
        "recommendations": [{"flag": r.flag, "value": r.value, "why": r.why} for r in cause.recommendations],
        "steps": list(cause.steps),
        "source": cause.source,
        "read_timestamp_seconds": cause.read_wall_time_s,
    }
