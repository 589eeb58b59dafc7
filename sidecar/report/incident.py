"""An incident's folder name, what fits in its size limit, which folders to drop, its manifest. Pure.

Names sort by time: `20260102T030405Z-engine_hung` (a second incident in the same second gets `-2`), so the
oldest are the first in name order and retention needs nothing but the names. The size limit is shared out
in order of worth: the stacks (the engine's first), the log, the /status history, the metrics; each piece
gets what is left, and a cut log keeps its newest lines, anything else its first.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime

from sidecar.model.incident import (
    MANIFEST_VERSION,
    CapturedFile,
    IncidentRef,
    LimitsDocument,
    ManifestDocument,
    NotCaptured,
    Trigger,
)

NAME = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9_]+(?:-\d+)?$")
MANIFEST_RESERVE_BYTES = 16 * 2**10  # kept out of the pieces' share for manifest.json itself
_CAUSE = re.compile(r"[^a-z0-9_]+")


def incident_name(wall_time_s: float, cause: str, existing: Collection[str]) -> str:
    """`<UTC time>-<cause>`, unique among `existing`."""
    stamp = datetime.fromtimestamp(wall_time_s, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{_CAUSE.sub('_', cause.lower()).strip('_') or 'unknown'}"
    name, number = base, 1
    while name in existing:
        number += 1
        name = f"{base}-{number}"
    return name


def is_incident_name(name: str) -> bool:
    return NAME.match(name) is not None


def expired(names: Iterable[str], keep: int) -> list[str]:
    """The incident folders to remove so that `keep` remain (the newest); other names are never touched."""
    ours = sorted(name for name in names if is_incident_name(name))
    return ours[: max(0, len(ours) - keep)]


def stacks_file(pid: int, role: str) -> str:
    return f"stacks-{role}-{pid}.txt"


def shares(sizes: Sequence[int], max_bytes: int) -> list[int]:
    """How many bytes each piece may keep, in order of worth: each gets what it needs of what is left."""
    left = max(0, max_bytes - MANIFEST_RESERVE_BYTES)
    kept = []
    for size in sizes:
        share = min(size, left)
        kept.append(share)
        left -= share
    return kept


def keep_head(data: bytes, max_bytes: int) -> bytes:
    """The first `max_bytes`, cut after the last whole line when there is one."""
    if len(data) <= max_bytes:
        return data
    head = data[:max_bytes]
    end = head.rfind(b"\n")
    return head[: end + 1] if end >= 0 else head


def keep_tail(data: bytes, max_bytes: int) -> bytes:
    """The last `max_bytes`, from the first whole line when there is one."""
    if len(data) <= max_bytes:
        return data
    if max_bytes <= 0:
        return b""
    tail = data[-max_bytes:]
    start = tail.find(b"\n")
    return tail[start + 1 :] if 0 <= start < len(tail) - 1 else tail


def manifest_document(
    *,
    incident: IncidentRef,
    trigger: Trigger,
    state: str,
    reason: str,
    vllm_url: str,
    captured: Sequence[CapturedFile],
    not_captured: Sequence[NotCaptured],
    capture_s: float,
    timeout_s: float,
    max_bytes: int,
    vllm_command: str | None = None,
) -> ManifestDocument:
    return {
        "version": MANIFEST_VERSION,
        "time": rfc3339(incident.wall_time_s),
        "timestamp_seconds": incident.wall_time_s,
        "cause": incident.cause,
        "trigger": str(trigger),
        "decision": {"state": state, "reason": reason},
        "vllm_url": vllm_url,
        "captured": list(captured),
        "not_captured": list(not_captured),
        "capture_seconds": round(capture_s, 3),
        "limits": LimitsDocument(timeout_seconds=timeout_s, max_bytes=max_bytes),
        "vllm_command": vllm_command,
    }


def rfc3339(wall_time_s: float) -> str:
    return datetime.fromtimestamp(wall_time_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def summary_line(manifest: ManifestDocument) -> str:
    """`incident engine_hung at 2026-...Z: stacks of 2 processes, log, metrics, status history; not: ...`."""
    stacks = sum(1 for item in manifest["captured"] if item["kind"] == "stacks")
    parts = [f"stacks of {stacks} process{'es' if stacks != 1 else ''}"] if stacks else []
    parts += [item["kind"].replace("_", " ") for item in manifest["captured"] if item["kind"] != "stacks"]
    line = f"incident {manifest['cause']} at {manifest['time']}: " + (", ".join(parts) or "nothing captured")
    missing = [f"{item['kind'].replace('_', ' ')}: {item['why']}" for item in manifest["not_captured"]]
    return line + ("; not captured: " + "; ".join(missing) if missing else "")
