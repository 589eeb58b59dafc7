"""The latest immutable picture the daemon publishes for /metrics, /status and /readyz. Pure data."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model.derived import Derived
from sidecar.model.snapshot import Snapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    snapshot: Snapshot
    derived: Derived
