"""Per-GPU derived values: vLLM's memory budget, memory outside it, growth trend and time to OOM. Pure."""

from __future__ import annotations

from bisect import bisect_left

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.trend import fit_line, fit_since_change
from sidecar.model.derived import GpuDerived
from sidecar.model.gpu import GpuDevice, ProcessOwner
from sidecar.model.snapshot import Snapshot

# Memory freed at once by more than this share of the card means a process went away (vLLM restarted, a
# tenant exited): the trend before it says nothing about the trend after.
REGIME_DROP_RATIO = 0.05


class MemoryHistory:
    """(time, used bytes) per GPU index since `start_s` and since its last large drop, from every successful GPU
    reading, kept up to date one snapshot at a time (the tests hold it to the scan it replaces:
    tests/unit/derive_oracles.py).

    A large drop clears a GPU's points, and whether a point is one depends only on the point before it. So
    the answer is the points from the newest drop on, if the point before that drop is in the range too, else
    every point in the range: found by bisection, without rescanning every GPU of every snapshot each tick.
    """

    def __init__(self) -> None:
        # Per GPU index: snapshot numbers, times, (time, used bytes) points, and the newest drop's number
        # with the number and time of the point before it.
        self._gpus: dict[int, tuple[list[int], list[float], list[tuple[float, float]]]] = {}
        self._drops: dict[int, tuple[int, int, float]] = {}

    def reset(self) -> None:
        self._gpus.clear()
        self._drops.clear()

    def add(self, snapshot: Snapshot, number: int) -> None:
        if snapshot.gpu is None or snapshot.gpu.value is None or snapshot.gpu.error is not None:
            return
        for device in snapshot.gpu.value.devices:
            numbers, times, points = self._gpus.setdefault(device.index, ([], [], []))
            used = float(device.memory_used_bytes)
            if points and points[-1][1] - used > REGIME_DROP_RATIO * device.memory_total_bytes:
                self._drops[device.index] = (number, numbers[-1], times[-1])
            numbers.append(number)
            times.append(snapshot.monotonic_s)
            points.append((snapshot.monotonic_s, used))

    def since(self, start_s: float, oldest: int) -> dict[int, list[tuple[float, float]]]:
        """Per GPU, the points at or after `start_s` among the snapshots numbered `oldest` and later."""
        history: dict[int, list[tuple[float, float]]] = {}
        for index, (numbers, times, points) in list(self._gpus.items()):
            gone = bisect_left(numbers, oldest)  # no longer in the window
            if gone:
                del numbers[:gone], times[:gone], points[:gone]
            if not numbers:
                del self._gpus[index]
                self._drops.pop(index, None)
                continue
            first = bisect_left(times, start_s)
            drop = self._drops.get(index)
            if drop is not None and drop[1] >= oldest and drop[2] >= start_s:
                first = bisect_left(numbers, drop[0])
            if first < len(points):
                history[index] = points[first:]
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
        # The window shows a trend; its growth now is the slope since it last changed (a pause that stopped the
        # leaking requests), or a forecast from the old slope stands still while free memory falls.
        current = fit_since_change(used_history, fit, settings.min_trend_points)
        growth, r2 = current.slope_per_s, current.r2
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
