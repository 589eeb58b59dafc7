"""An incident folder: what the sidecar kept of vLLM before a restart or after a crash. Pure data and schema.

`<state-dir>/incidents/<UTC time>-<cause>/` holds `manifest.json` (`ManifestDocument`: written by
`sidecar.report.incident`, read by `vllm-sidecar doctor --incident DIR`) and the files it names. docs/incidents.md
describes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NotRequired

from typing_extensions import TypedDict

MANIFEST_FILE = "manifest.json"
LOG_FILE = "vllm.log"
METRICS_FILE = "metrics.txt"
STATUS_HISTORY_FILE = "status-history.json"
MANIFEST_VERSION = 1


class Trigger(StrEnum):
    BEFORE_RESTART = "before_restart"  # the sidecar is about to restart vLLM: its processes are still there
    AFTER_CRASH = "after_crash"  # vLLM died and came back without the sidecar: its processes are gone


class Kind(StrEnum):
    STACKS = "stacks"
    LOG = "log"
    METRICS = "metrics"
    STATUS_HISTORY = "status_history"


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentRef:
    """An incident as /status and the notifications name it."""

    path: str  # the folder
    cause: str  # the restart reason, or "vllm_died"
    wall_time_s: float


class CapturedFile(TypedDict):
    kind: str  # a Kind
    file: str  # relative to the folder
    bytes: int
    truncated: bool  # cut to fit the incident's size limit (a log keeps its newest lines, the rest their first)
    pid: int | None  # the process, for stacks
    role: str | None  # its role (api_server, engine_core, worker, ...), for stacks
    note: str | None  # where it came from, or its age


class NotCaptured(TypedDict):
    kind: str
    pid: int | None
    role: str | None
    why: str  # one line: what is missing (a permission, py-spy, a log source) or what went wrong


class DecisionDocument(TypedDict):
    state: str  # the policy's state when the incident was taken
    reason: str  # the decision's reason, with its numbers


class LimitsDocument(TypedDict):
    timeout_seconds: float
    max_bytes: int


class ManifestDocument(TypedDict):
    version: int
    time: str  # RFC 3339, UTC
    timestamp_seconds: float
    cause: str
    trigger: str  # a Trigger
    decision: DecisionDocument
    vllm_url: str
    captured: list[CapturedFile]
    not_captured: list[NotCaptured]
    capture_seconds: float  # how long the capture took (what it held the restart back, before a restart)
    limits: LimitsDocument
    # vLLM's API server's command line (secrets as ***) where its process was seen; not in folders before it
    vllm_command: NotRequired[str | None]
