"""Reads the watched GPUs through NVML each tick: memory, utilisation, temperature, processes and Xid errors.

Does I/O: every NVML call and every /proc read of a read runs in one worker thread, never on the event loop.
``read`` never raises: a missing library or driver, a lost GPU or a bad index becomes an error result. No GPU
is a normal state, so ``nvmlInit`` is retried at most every ``retry_init_s`` and costs nothing in between.

NVML calls can block for minutes (a wedged driver, a GPU falling off the bus), so a read waits at most
``timeout_s``: the tick goes on with an error, and while that call is still stuck no other is made. The
worker is a daemon thread, not the default executor's, so a call stuck for good cannot hold up the exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading
from sidecar.model.source import SourceResult
from sidecar.sources.proc import DEFAULT_VLLM_PATTERN, identify_process

SOURCE_NAME = "nvml"
# A storm of Xid events must not stall a tick; what is left is drained on the next one.
MAX_XID_EVENTS_PER_READ = 1000
# How long `close` waits for a read stuck in the driver before it gives up on shutting NVML down cleanly.
CLOSE_WAIT_S = 2.0

# After these the NVML session is no use (GPU fell off the bus, driver unloaded or upgraded under us): drop it
# and initialise again later rather than repeating the same failure every tick.
_SESSION_LOST_CODES = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_UNKNOWN",
)

# The answers of a driver (or an older pynvml) without nvmlDeviceGetMemoryInfo_v2.
_NO_MEMORY_V2 = ("NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")


class _ReadError(Exception):
    """A read that produced no reading; its message is the result's one-line error."""


class _SessionLostError(_ReadError):
    """The NVML session must be shut down and initialised again."""


def _text(value: Any) -> str:
    # nvidia-ml-py decodes strings; pynvml releases before 11.515 returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - NVMLError.__str__ may call into the library; a message must not fail
        message = ""
    if not message or message.startswith("NVML Error with code"):
        # pynvml spells out only some codes; its class name (NVMLError_GpuNotFound) names every one.
        message = f"{type(exc).__name__.removeprefix('NVMLError_')} {message}".strip()
    return " ".join(message.split())


class NvmlSource:
    """One NVML session shared by all reads of the watched GPUs; ``close`` ends it."""

    def __init__(
        self,
        *,
        gpu_indices: Sequence[int] | None = None,
        vllm_process_pattern: str = DEFAULT_VLLM_PATTERN,
        proc_root: Path = Path("/proc"),
        nvml: Any = None,  # the pynvml module or a fake of it; Any because pynvml ships no type stubs
        clock: Callable[[], float] = time.monotonic,
        retry_init_s: float = 60.0,
        timeout_s: float | None = None,  # None: wait for NVML however long it takes (one-shot commands)
        unavailable_hint: str | None = None,  # what the command's user can do without NVML, after its error
    ) -> None:
        if gpu_indices is not None and any(index < 0 for index in gpu_indices):
            raise ValueError(f"gpu_indices must be >= 0, got {list(gpu_indices)}")
        self._gpu_indices = tuple(gpu_indices) if gpu_indices is not None else None
        self._pattern = re.compile(vllm_process_pattern)
        self._proc_root = proc_root
        self._nvml: Any = nvml
        self._clock = clock
        self._retry_init_s = retry_init_s
        self._memory_v2 = True  # until the driver says it has no v2 memory info
        self._timeout_s = timeout_s
        self._hint = f"; {unavailable_hint}" if unavailable_hint else ""
        self._stuck: concurrent.futures.Future[GpuReading] | None = None  # a read that outlived its timeout
        # Reads run in worker threads and would overlap if a caller did not await the last one: one at a time.
        self._lock = threading.Lock()
        self._closed = False
        self._initialised = False
        self._next_init_at: float | None = None  # no nvmlInit before this monotonic time
        self._unavailable = ""  # the error repeated until the next nvmlInit is due
        self._incomplete = False  # GPUs were missing: once due, initialise again so NVML enumerates new ones
        self._event_set: Any = None
        self._xid_watched: set[int] = set()
        self._session_problems: tuple[str, ...] = ()
        # Cumulative since the source started, so they survive a re-initialisation.
        self._xid_total: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}

    async def read(self) -> SourceResult[GpuReading]:
        started = self._clock()
        if self._stuck is not None and not self._stuck.done():
            # Another call would only queue behind the stuck one (reads take turns): report, do not ask.
            return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, error=self._stuck_error())
        self._stuck = None
        work: concurrent.futures.Future[GpuReading] = concurrent.futures.Future()
        threading.Thread(target=self._work, args=(work,), name="nvml-read", daemon=True).start()
        waiting = asyncio.wrap_future(work)
        # Once we stop waiting nobody reads its outcome: retrieve it so asyncio logs no unretrieved exception.
        waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            async with asyncio.timeout(self._timeout_s):
                reading = await asyncio.shield(waiting)
        except TimeoutError:
            self._stuck = work
            return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, error=self._stuck_error())
        except _ReadError as exc:
            return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a source never raises into the loop, whatever the binding does
            error = f"NVML read failed: {type(exc).__name__}: {_describe(exc)}"
            return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, error=error)
        return SourceResult(source=SOURCE_NAME, duration_s=self._clock() - started, value=reading)

    def close(self) -> None:
        """Free the event set and shut NVML down. Safe to call twice; later reads report the source closed.

        A read stuck in the driver holds the lock: after CLOSE_WAIT_S the session is left as it is (the
        process is stopping) rather than hanging the shutdown on it."""
        if not self._lock.acquire(timeout=CLOSE_WAIT_S):
            self._closed = True
            return
        try:
            self._closed = True
            if self._nvml is not None:
                self._end_session()
        finally:
            self._lock.release()

    def _stuck_error(self) -> str:
        # The same line on every tick while stuck: the log shows the change once, not a line per tick.
        waited = f"{self._timeout_s:g} s"
        return f"NVML read did not return within {waited} (driver not responding); not asked again until it does"

    def _work(self, work: concurrent.futures.Future[GpuReading]) -> None:
        """The worker thread's whole job: one blocking read, its outcome handed back through `work`."""
        if not work.set_running_or_notify_cancel():
            return
        try:
            work.set_result(self._read_blocking())
        except Exception as exc:  # noqa: BLE001 - every failure goes back to `read`, which turns it into a result
            work.set_exception(exc)

    # --- session --------------------------------------------------------------------------------------------
    def _bind_module(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - imported on first use, in the worker thread
            except ImportError as exc:
                raise _ReadError(f"NVML not available: {_describe(exc)}{self._hint}") from exc
            self._nvml = pynvml
        return self._nvml

    def _ensure_session(self, nvml: Any) -> None:
        now = self._clock()
        due = self._next_init_at is None or now >= self._next_init_at
        if self._initialised and not (self._incomplete and due):
            return
        if not due:
            raise _ReadError(self._unavailable)
        self._end_session()
        self._next_init_at = now + self._retry_init_s
        try:
            nvml.nvmlInit()
        except Exception as exc:  # whatever stops nvmlInit, NVML is unavailable until the next try
            self._unavailable = f"NVML not available: {_describe(exc)}{self._hint}"
            raise _ReadError(self._unavailable) from exc
        self._initialised = True
        self._incomplete = False
        self._watch_xid(nvml)

    def _end_session(self) -> None:
        # Best effort: a session ends because something failed or we stop, so failures here tell nothing new.
        nvml = self._nvml
        if self._event_set is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._event_set)  # before nvmlShutdown, which would orphan it
        if self._initialised:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
        self._event_set = None
        self._xid_watched = set()
        self._session_problems = ()
        self._initialised = False

    def _refusal(self, what: str, exc: Exception, problems: list[str] | None = None) -> _ReadError:
        """The error for an NVML refusal (raised here if the session is lost); NotSupported is no problem."""
        nvml = self._nvml
        code = getattr(exc, "value", None)
        lost = any(code == getattr(nvml, name) for name in _SESSION_LOST_CODES)
        error = (_SessionLostError if lost else _ReadError)(f"{what}: {_describe(exc)}")
        if lost:
            raise error from exc
        if problems is not None and code != nvml.NVML_ERROR_NOT_SUPPORTED:
            problems.append(str(error))
        return error

    def _call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except self._nvml.NVMLError as exc:
            raise self._refusal(what, exc) from exc

    def _optional(self, what: str, problems: list[str], function: Callable[..., Any], *args: Any) -> Any:
        """A field the GPU may not offer: None instead of failing the whole read."""
        try:
            return function(*args)
        except self._nvml.NVMLError as exc:
            self._refusal(what, exc, problems)
            return None

    # --- reading --------------------------------------------------------------------------------------------
    def _read_blocking(self) -> GpuReading:
        with self._lock:
            if self._closed:
                raise _ReadError("NVML source closed")
            nvml = self._bind_module()
            try:
                self._ensure_session(nvml)
                return self._collect(nvml)
            except _SessionLostError as exc:
                self._end_session()
                self._next_init_at = self._clock() + self._retry_init_s
                self._unavailable = str(exc)
                raise

    def _collect(self, nvml: Any) -> GpuReading:
        count = self._call("NVML device count", nvml.nvmlDeviceGetCount)
        indices = self._gpu_indices if self._gpu_indices is not None else tuple(range(count))
        missing = [index for index in indices if index >= count]
        self._incomplete = bool(missing) or count == 0
        if missing:
            names = ", ".join(str(index) for index in missing)
            visible = f"{count} GPU{'' if count == 1 else 's'} visible"
            raise _ReadError(f"GPU{'' if len(missing) == 1 else 's'} {names} not found: {visible}")
        problems = [*self._session_problems, *(["NVML found no GPU"] if not indices else [])]
        self._drain_xid(nvml, problems)
        devices = tuple(self._read_device(nvml, index, problems) for index in indices)
        driver = self._optional("NVML driver version", problems, nvml.nvmlSystemGetDriverVersion)
        return GpuReading(
            devices=devices,
            driver_version=None if driver is None else _text(driver),
            problems=tuple(problems),
        )

    def _memory(self, nvml: Any, index: int, handle: Any) -> tuple[int, int, int]:
        """Total, used and free as CUDA (and so vLLM's budget) counts them: without the memory the driver keeps
        for itself, which v1 counts as used and in the total (measured on an H200, driver 580: 615 MiB, and
        v2's total - reserved equals cudaMemGetInfo's total to the byte). Drivers without v2 give v1's view."""
        version = getattr(nvml, "nvmlMemory_v2", None)  # absent from a pynvml older than the driver's v2
        if self._memory_v2 and version is not None:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except nvml.NVMLError as exc:
                code = getattr(exc, "value", None)
                if not any(code == getattr(nvml, name, None) for name in _NO_MEMORY_V2):
                    raise self._refusal(f"GPU {index} memory", exc) from exc
                self._memory_v2 = False  # this driver has no v2: ask v1 from now on
            else:
                return int(memory.total) - int(memory.reserved), int(memory.used), int(memory.free)
        memory = self._call(f"GPU {index} memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        return int(memory.total), int(memory.used), int(memory.free)

    def _read_device(self, nvml: Any, index: int, problems: list[str]) -> GpuDevice:
        handle = self._call(f"GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
        total, used, free = self._memory(nvml, index, handle)
        uuid = self._optional(f"GPU {index} UUID", problems, nvml.nvmlDeviceGetUUID, handle)
        name = self._optional(f"GPU {index} name", problems, nvml.nvmlDeviceGetName, handle)
        util = self._optional(f"GPU {index} utilization", problems, nvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = self._optional(
            f"GPU {index} temperature",
            problems,
            nvml.nvmlDeviceGetTemperature,
            handle,
            nvml.NVML_TEMPERATURE_GPU,
        )
        watched = index in self._xid_watched
        return GpuDevice(
            index=index,
            uuid=None if uuid is None else _text(uuid),
            name=None if name is None else _text(name),
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            utilization_ratio=None if util is None else int(util.gpu) / 100.0,
            temperature_celsius=None if temperature is None else float(temperature),
            processes=self._read_processes(nvml, index, handle, problems),
            xid_errors_total=self._xid_total.get(index, 0) if watched else None,
            last_xid=self._last_xid.get(index) if watched else None,
        )

    def _read_processes(self, nvml: Any, index: int, handle: Any, problems: list[str]) -> tuple[GpuProcess, ...]:
        used_by_pid: dict[int, int | None] = {}
        for kind, function in (
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for info in self._optional(f"GPU {index} {kind} processes", problems, function, handle) or ():
                # A process with both contexts is listed twice with the same figure: keep one, a known one.
                if used_by_pid.get(int(info.pid)) is None:
                    used_by_pid[int(info.pid)] = None if info.usedGpuMemory is None else int(info.usedGpuMemory)
        processes = []
        for pid, used in sorted(used_by_pid.items()):
            identity = identify_process(pid, proc_root=self._proc_root, pattern=self._pattern)
            processes.append(GpuProcess(pid=pid, used_memory_bytes=used, name=identity.name, owner=identity.owner))
        return tuple(processes)

    # --- Xid events -----------------------------------------------------------------------------------------
    def _watch_xid(self, nvml: Any) -> None:
        """Register for Xid events on each watched GPU present; one that cannot report them gets None."""
        problems: list[str] = []
        self._event_set = self._optional("NVML event set", problems, nvml.nvmlEventSetCreate)
        count = self._call("NVML device count", nvml.nvmlDeviceGetCount) if self._event_set is not None else 0
        indices = self._gpu_indices if self._gpu_indices is not None else range(count)
        for index in (index for index in indices if index < count):
            handle = self._call(f"GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
            except nvml.NVMLError as exc:
                self._refusal(f"GPU {index} Xid events", exc, problems)
            else:
                self._xid_watched.add(index)
        self._session_problems = tuple(problems)

    def _drain_xid(self, nvml: Any, problems: list[str]) -> None:
        if self._event_set is None:
            return
        for _ in range(MAX_XID_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait(self._event_set, 0)  # 0 ms: a poll, never block the tick
            except nvml.NVMLError_Timeout:
                return  # nothing (more) pending
            except nvml.NVMLError as exc:
                self._refusal("NVML Xid events", exc, problems)
                return
            if int(event.eventType) & nvml.nvmlEventTypeXidCriticalError:
                # The event names its GPU by handle; handles do not compare by value, indices do.
                index = self._call("NVML Xid event GPU", nvml.nvmlDeviceGetIndex, event.device)
                self._xid_total[index] = self._xid_total.get(index, 0) + 1
                self._last_xid[index] = int(event.eventData)
        problems.append(f"Xid drain stopped after {MAX_XID_EVENTS_PER_READ} events; the rest are read next tick")
