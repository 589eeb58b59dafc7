"""Per-GPU derived values: vLLM's memory budget, memory outside it, growth trend and time to OOM. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.trend import fit_line
from sidecar.model.derived import GpuDerived
from sidecar.model.gpu import GpuDevice, ProcessOwner
from sidecar.model.snapshot import Snapshot

# Memory freed at once by more than this share of the card means a process went away (vLLM restarted, a
# tenant exited): the trend before it says nothing about the trend after.
REGIME_DROP_RATIO = 0.05


def memory_history(snapshots: Iterable[Snapshot]) -> dict[int, list[tuple[float, float]]]:
    """(time, used bytes) per GPU index since its last large drop, from every successful GPU reading."""
    history: dict[int, list[tuple[float, float]]] = {}
    for snapshot in snapshots:
        if snapshot.gpu is None or snapshot.gpu.value is None or snapshot.gpu.error is not None:
            continue
        for device in snapshot.gpu.value.devices:
            points = history.setdefault(device.index, [])
            used = float(device.memory_used_bytes)
            if points and points[-1][1] - used > REGIME_DROP_RATIO * device.memory_total_bytes:
                points.clear()
            points.append((snapshot.monotonic_s, used))
    return history


def derive_gpu(
    device: GpuDevice,
    used_history: list[tuple[float, float]],
    gpu_memory_utilization: float | None,
    settings: DeriveSettings,
) -> GpuDerived:
    budget = int(device.memory_total_bytes * gpu_memory_utilization) if gpu_memory_utilization is not None else None
    fit = fit_line(used_history)
    growth = None
    r2 = None
    time_to_oom = None
    if fit is not None and fit.points >= settings.min_trend_points and fit.span_s >= settings.min_trend_span_s:
        growth, r2 = fit.slope_per_s, fit.r2
        if growth > 0 and r2 >= settings.min_trend_r2:
            time_to_oom = max(0.0, (device.memory_total_bytes - device.memory_used_bytes) / growth)
    by_owner = _memory_by_owner(device)
    return GpuDerived(
        gpu=device.index,
        memory_total_bytes=device.memory_total_bytes,
        memory_used_bytes=device.memory_used_bytes,
        memory_free_bytes=device.memory_free_bytes,
        memory_budget_bytes=budget,
        memory_over_budget_bytes=device.memory_used_bytes - budget if budget is not None else None,
        memory_growth_bytes_per_second=growth,
        memory_growth_fit_r2=r2,
        time_to_oom_seconds=time_to_oom,
        vllm_process_memory_bytes=by_owner[ProcessOwner.VLLM],
        other_process_memory_bytes=by_owner[ProcessOwner.OTHER],
        unknown_process_memory_bytes=by_owner[ProcessOwner.UNKNOWN],
        utilization_ratio=device.utilization_ratio,
        temperature_celsius=device.temperature_celsius,
        xid_errors_total=device.xid_errors_total,
        last_xid=device.last_xid,
    )


def _memory_by_owner(device: GpuDevice) -> dict[ProcessOwner, int]:
    totals = dict.fromkeys(ProcessOwner, 0)
    for process in device.processes:
        if process.used_memory_bytes is not None:
            totals[process.owner] += process.used_memory_bytes
    return totals
