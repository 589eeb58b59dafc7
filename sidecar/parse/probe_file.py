"""Parses one file of the allocator probe (``<dir>/<pid>.json``, see the contract) into a ``ProbeProcess``. Pure.

Strict: a file that is not exactly the documented shape is refused with one line saying what is wrong, so a
file written by something else, or by a future plugin with other meanings, never becomes a value.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sidecar.model.allocator import AllocatorDevice, ProbeProcess, ProcessRole

_DEVICE_COUNTERS = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "peak_reserved_bytes",
    "num_alloc_retries",
    "num_ooms",
    "free_bytes",
    "total_bytes",
)
MAX_DEVICES = 64


class ProbeFileError(ValueError):
    """The file is not a probe document; the message says why, in one line."""


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProbeFileError(f"{where} is not an object")
    return value


def _count(value: object, where: str) -> int:
    # bool is an int in Python but never a count in this document
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProbeFileError(f"{where} is not a non-negative integer: {value!r:.40}")
    return value


def _seconds(value: object, where: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProbeFileError(f"{where} is not a number: {value!r:.40}")
    if value < 0 or (positive and value == 0):
        raise ProbeFileError(f"{where} is out of range: {value!r}")
    return float(value)


def _device(raw: object, where: str) -> AllocatorDevice:
    fields = _object(raw, where)
    counts = {name: _count(fields.get(name), f"{where}.{name}") for name in _DEVICE_COUNTERS}
    uuid = fields.get("uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise ProbeFileError(f"{where}.uuid is not a string")
    return AllocatorDevice(
        index=_count(fields.get("index"), f"{where}.index"),
        uuid=uuid,
        allocated_bytes=counts["allocated_bytes"],
        reserved_bytes=counts["reserved_bytes"],
        active_bytes=counts["active_bytes"],
        inactive_split_bytes=counts["inactive_split_bytes"],
        peak_reserved_bytes=counts["peak_reserved_bytes"],
        alloc_retries=counts["num_alloc_retries"],
        ooms=counts["num_ooms"],
        free_bytes=counts["free_bytes"],
        total_bytes=counts["total_bytes"],
    )


def parse_probe_file(data: bytes) -> ProbeProcess:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ProbeFileError(f"not JSON: {error}") from None
    top = _object(document, "the document")
    try:
        role = ProcessRole(str(top.get("role")))
    except ValueError:
        raise ProbeFileError(f"role is not api, engine, worker or other: {top.get('role')!r:.40}") from None
    rank = top.get("rank")
    if rank is not None:
        rank = _count(rank, "rank")
    cuda = _object(top.get("cuda"), "cuda")
    available = cuda.get("available")
    if not isinstance(available, bool):
        raise ProbeFileError("cuda.available is not true or false")
    reason = cuda.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ProbeFileError("cuda.reason is not a string")
    devices = cuda.get("devices")
    if not isinstance(devices, list):
        raise ProbeFileError("cuda.devices is not a list")
    if len(devices) > MAX_DEVICES:
        raise ProbeFileError(f"cuda.devices lists {len(devices)} devices (at most {MAX_DEVICES})")
    if devices and not available:
        raise ProbeFileError("cuda.devices lists devices while cuda.available is false")
    return ProbeProcess(
        pid=_count(top.get("pid"), "pid"),
        role=role,
        rank=rank,
        time_unix_s=_seconds(top.get("time_unix_s"), "time_unix_s", positive=True),
        interval_s=_seconds(top.get("interval_s"), "interval_s", positive=True),
        cuda_available=available,
        reason=reason[:300] if reason is not None else None,
        devices=tuple(_device(device, f"cuda.devices[{number}]") for number, device in enumerate(devices)),
    )
