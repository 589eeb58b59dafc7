"""vLLM's server's command line as the sidecar saw it while vLLM served. Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCommand:
    pid: int
    command: str  # its whole command line, arguments joined by spaces, secrets redacted
    seen_wall_s: float  # when /proc showed it (Unix seconds)
