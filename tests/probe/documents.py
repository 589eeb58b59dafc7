"""Probe documents as the plugin writes them, for the source and derivation tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GIB = 1 << 30


def device(index: int = 0, **overrides: int | str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:08d}",
        "allocated_bytes": 6 * GIB,
        "reserved_bytes": 8 * GIB,
        "active_bytes": 6 * GIB,
        "inactive_split_bytes": 2 * GIB,
        "peak_reserved_bytes": 9 * GIB,
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "free_bytes": 10 * GIB,
        "total_bytes": 80 * GIB,
    }
    fields.update(overrides)
    return fields


def document(
    pid: int, *, time_unix_s: float, role: str = "worker", rank: int | None = 0, devices: list[Any] | None = None
) -> dict[str, Any]:
    listed = [device()] if devices is None else devices
    return {
        "pid": pid,
        "role": role,
        "rank": rank,
        "time_unix_s": time_unix_s,
        "interval_s": 2.0,
        "cuda": {"available": bool(listed), "reason": None if listed else "CUDA is not initialised", "devices": listed},
    }


def write(folder: Path, content: dict[str, Any]) -> Path:
    path = folder / f"{content['pid']}.json"
    path.write_text(json.dumps(content))
    return path
