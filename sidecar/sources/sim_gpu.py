"""Reads the simulated GPUs of `vllm-sidecar sim` from its `/sim/gpu` JSON. Does network I/O.

Chosen only with `--gpu-source sim`: a sidecar pointed at a real vLLM must never read made-up GPUs. The
document is validated field by field; anything malformed is a one-line error, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence

from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading, ProcessOwner
from sidecar.model.source import SourceResult
from sidecar.model.text import plural
from sidecar.sources.fetch import BodyFetcher, Failure, FetchFailedError

SOURCE = "sim-gpu"
_MAX_BYTES = 1024 * 1024


class SimGpuDocumentError(ValueError):
    """The /sim/gpu document does not have the expected shape."""


class SimGpuSource:
    def __init__(
        self,
        *,
        fetcher: BodyFetcher,
        url: str,
        timeout_s: float,
        gpu_indices: Sequence[int] | None = None,
        vllm_process_pattern: str = r"vllm|VLLM::",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetcher = fetcher
        self.url = url
        self._timeout_s = timeout_s
        self._gpu_indices = tuple(gpu_indices) if gpu_indices is not None else None
        self._pattern = re.compile(vllm_process_pattern)
        self._clock = clock

    async def read(self) -> SourceResult[GpuReading]:
        started = self._clock()
        try:
            async with asyncio.timeout(self._timeout_s):
                body = await self._fetcher.get(self.url, max_bytes=_MAX_BYTES)
            reading = self._reading(json.loads(body))
        except TimeoutError:
            return self._error(started, f"did not answer within {self._timeout_s:g} s")
        except FetchFailedError as error:
            return self._error(started, _reason(error))
        except (SimGpuDocumentError, ValueError) as error:
            return self._error(started, str(error))
        return SourceResult(source=SOURCE, duration_s=self._clock() - started, value=reading)

    def close(self) -> None:
        """Nothing to release: the HTTP client belongs to the caller."""

    def _error(self, started: float, reason: str) -> SourceResult[GpuReading]:
        return SourceResult(
            source=SOURCE, duration_s=self._clock() - started, error=f"simulated GPU {self.url} {reason}"
        )

    def _reading(self, document: object) -> GpuReading:
        gpus = _list(document, "gpus")
        devices = tuple(self._device(gpu) for gpu in gpus)
        if self._gpu_indices is not None:
            present = {device.index for device in devices}
            missing = [index for index in self._gpu_indices if index not in present]
            if missing:
                raise SimGpuDocumentError(f"has no GPU {missing[0]}: {plural(len(devices), 'GPU')} simulated")
            devices = tuple(device for device in devices if device.index in self._gpu_indices)
        return GpuReading(devices=devices, driver_version="simulated")

    def _device(self, gpu: object) -> GpuDevice:
        total = _int(gpu, "total_bytes")
        used = _int(gpu, "used_bytes")
        processes = tuple(self._process(process) for process in _list(gpu, "processes"))
        return GpuDevice(
            index=_int(gpu, "index"),
            uuid=_str(gpu, "uuid"),
            name=_str(gpu, "name"),
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=max(0, total - used),
            utilization_ratio=_float(gpu, "utilization_ratio"),
            temperature_celsius=_float(gpu, "temperature_celsius"),
            processes=processes,
            xid_errors_total=None,
            last_xid=None,
        )

    def _process(self, process: object) -> GpuProcess:
        name = _str(process, "name")
        return GpuProcess(
            pid=_int(process, "pid"),
            used_memory_bytes=_int(process, "used_bytes"),
            name=name,
            # The same rule the NVML source applies to /proc names, so the sim exercises it.
            owner=ProcessOwner.VLLM if self._pattern.search(name) else ProcessOwner.OTHER,
        )


def _reason(error: FetchFailedError) -> str:
    match error.failure:
        case Failure.STATUS:
            return f"answered HTTP {error.status}"
        case Failure.TOO_LARGE:
            return f"answer over {_MAX_BYTES} bytes"
        case Failure.BAD_URL:
            return str(error)
        case Failure.CONNECT | Failure.DROPPED | Failure.FAILED:
            return f"unreachable: {error.client_error}"


def _value(document: object, key: str) -> object:
    if not isinstance(document, dict) or key not in document:
        raise SimGpuDocumentError(f"document lacks {key!r}")
    return document[key]


def _int(document: object, key: str) -> int:
    value = _value(document, key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise SimGpuDocumentError(f"document field {key!r} is not an integer")
    return value


def _float(document: object, key: str) -> float:
    value = _value(document, key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise SimGpuDocumentError(f"document field {key!r} is not a number")
    return float(value)


def _str(document: object, key: str) -> str:
    value = _value(document, key)
    if not isinstance(value, str):
        raise SimGpuDocumentError(f"document field {key!r} is not a string")
    return value


def _list(document: object, key: str) -> list[object]:
    value = _value(document, key)
    if not isinstance(value, list):
        raise SimGpuDocumentError(f"document field {key!r} is not a list")
    return value
