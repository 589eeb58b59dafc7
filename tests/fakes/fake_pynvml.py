"""A strict fake of the part of the ``pynvml`` module the NVML source uses, driven by a scenario. No I/O.

Strict means it refuses what the real library refuses, with the real library's exception classes and return
shapes (``pynvml`` imports fine without a GPU): device calls before ``nvmlInit`` or on a handle from before
an ``nvmlShutdown`` raise Uninitialized, a bad index raises InvalidArgument, an empty event set times out,
and the device list is fixed at ``nvmlInit``, since NVML enumerates GPUs only when it initialises.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass
class FakeProcess:
    pid: int
    used_gpu_memory_bytes: int | None  # None: the binding reports "not available" as None
    graphics: bool = False


@dataclass
class FakeGpu:
    uuid: str
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    total_bytes: int = 80 * 1024**3
    used_bytes: int = 0
    utilization_percent: int = 0
    temperature_celsius: int = 40
    processes: list[FakeProcess] = field(default_factory=list)
    # Names of pynvml functions that answer NotSupported for this GPU (e.g. "nvmlDeviceGetTemperature").
    unsupported: set[str] = field(default_factory=set)
    # Other refusals: pynvml function name -> NVML_ERROR_* code it answers for this GPU.
    refusals: dict[str, int] = field(default_factory=dict)
    xid_supported: bool = True
    # Memory the driver keeps for itself (an H200 with driver 580: 615 MiB): v1 counts it as used and in the
    # total, v2 reports it apart; CUDA's total leaves it out.
    reserved_bytes: int = 0
    memory_v2: bool = True  # False: a driver older than nvmlDeviceGetMemoryInfo_v2 (FunctionNotFound)
    lost: bool = False  # every call on it answers GpuIsLost, as after "fallen off the bus"


@dataclass
class Scenario:
    gpus: list[FakeGpu] = field(default_factory=list)
    library_missing: bool = False
    driver_version: str = "550.54.15"


@dataclass(frozen=True)
class FakeHandle:
    index: int
    session: int  # which init/shutdown cycle it came from


@dataclass
class FakeEventData:
    device: FakeHandle
    eventType: int  # noqa: N815 - the real struct's field name
    eventData: int  # noqa: N815 - the real struct's field name
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815 - the real struct's field name
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815 - the real struct's field name


@dataclass
class FakeEventSet:
    session: int
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event type mask
    pending: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False


def _error(code: int) -> Exception:
    # NVMLError(code) maps to the real subclass, e.g. NVMLError_Uninitialized.
    error: Exception = pynvml.NVMLError(code)
    return error


# Names the fake forwards to the real module: constants and exception classes, never functions, so a function
# the fake does not implement fails loudly instead of reaching for a real driver.
_FORWARDED_PREFIXES = ("NVML_", "NVMLError", "nvmlEventType", "nvmlMemory_v", "nvmlTemperature_v")


class FakeNvml:
    """Stands in for the ``pynvml`` module; pass it as ``nvml=``."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.init_calls = 0
        self.shutdown_calls = 0
        self.call_threads: set[int] = set()
        self._lock = threading.Lock()
        self._refcount = 0
        self._session = 0
        self._visible: list[FakeGpu] = []
        self._event_sets: list[FakeEventSet] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_FORWARDED_PREFIXES):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name}")

    # --- test controls --------------------------------------------------------------------------------------
    def emit_xid(self, index: int, xid: int, *, count: int = 1) -> None:
        """Queue ``count`` Xid events from GPU ``index`` on every live set registered for Xid on it."""
        with self._lock:
            for event_set in self._event_sets:
                if event_set.freed or event_set.session != self._session:
                    continue
                if event_set.registered.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                    handle = FakeHandle(index=index, session=self._session)
                    event = FakeEventData(device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)
                    event_set.pending.extend([event] * count)

    @property
    def initialised(self) -> bool:
        return self._refcount > 0

    @property
    def live_event_sets(self) -> int:
        return sum(1 for event_set in self._event_sets if not event_set.freed)

    # --- checks the real library makes ----------------------------------------------------------------------
    def _enter(self) -> None:
        self.call_threads.add(threading.get_ident())
        if self._refcount == 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: FakeHandle, function: str) -> FakeGpu:
        self._enter()
        if not isinstance(handle, FakeHandle) or handle.session != self._session:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)  # a handle does not survive nvmlShutdown
        gpu = self._visible[handle.index]
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.refusals:
            raise _error(gpu.refusals[function])
        return gpu

    # --- the pynvml API -------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        self.call_threads.add(threading.get_ident())
        with self._lock:
            self.init_calls += 1
            if self.scenario.library_missing:
                raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
            if self._refcount == 0:
                self._session += 1
                self._visible = list(self.scenario.gpus)  # NVML enumerates GPUs when it initialises
            self._refcount += 1

    def nvmlShutdown(self) -> None:  # noqa: N802 - pynvml's name
        with self._lock:
            self._enter()
            self.shutdown_calls += 1
            self._refcount -= 1
            if self._refcount == 0:
                self._session += 1  # invalidates handles and event sets

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802 - pynvml's name
        self._enter()
        return self.scenario.driver_version

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        self._enter()
        return len(self._visible)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802 - pynvml's name
        self._enter()
        if not 0 <= index < len(self._visible):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._visible[index].lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index=index, session=self._session)

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:  # noqa: N802 - pynvml's name
        self._gpu(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:  # noqa: N802 - pynvml's name
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:  # noqa: N802 - pynvml's name
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        free = gpu.total_bytes - gpu.reserved_bytes - gpu.used_bytes
        if not version:
            return pynvml.c_nvmlMemory_t(total=gpu.total_bytes, free=free, used=gpu.used_bytes + gpu.reserved_bytes)
        if not gpu.memory_v2:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # the real one's answer to a missing symbol
        if version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=gpu.total_bytes, reserved=gpu.reserved_bytes, free=free, used=gpu.used_bytes
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:  # noqa: N802 - pynvml's name
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_percent, memory=0)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:  # noqa: N802 - pynvml's name
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_celsius

    def _processes(self, handle: FakeHandle, function: str, *, graphics: bool) -> list[Any]:
        gpu = self._gpu(handle, function)
        return [
            # The real binding hands back nvmlFriendlyObject with the struct's field names.
            pynvml.nvmlFriendlyObject(
                {
                    "pid": proc.pid,
                    "usedGpuMemory": proc.used_gpu_memory_bytes,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for proc in gpu.processes
            if proc.graphics == graphics
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:  # noqa: N802
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses", graphics=False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[Any]:  # noqa: N802
        return self._processes(handle, "nvmlDeviceGetGraphicsRunningProcesses", graphics=True)

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802 - pynvml's name
        with self._lock:
            self._enter()
            event_set = FakeEventSet(session=self._session)
            self._event_sets.append(event_set)
            return event_set

    def _live_set(self, event_set: FakeEventSet) -> FakeEventSet:
        self._enter()
        if not isinstance(event_set, FakeEventSet) or event_set.freed or event_set.session != self._session:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def nvmlDeviceRegisterEvents(  # noqa: N802 - pynvml's name
        self,
        handle: FakeHandle,
        eventTypes: int,  # noqa: N803 - pynvml's name
        eventSet: FakeEventSet,  # noqa: N803 - pynvml's name
    ) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        live = self._live_set(eventSet)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError and not gpu.xid_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            live.registered[handle.index] = live.registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:  # noqa: N802, N803
        with self._lock:
            live = self._live_set(eventSet)
            if not live.pending:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)  # the real one waits timeoutms first; 0 is a poll
            return live.pending.popleft()

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:  # noqa: N802, N803 - pynvml's names
        with self._lock:
            live = self._live_set(eventSet)
            live.freed = True
