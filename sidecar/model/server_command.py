"""vLLM's server's command line as the sidecar saw it while vLLM served, or as its pod's spec declares it. Pure
data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCommand:
    where: str  # "vLLM's server command line (pid 4242)", "container vllm's command in pod vllm-0's spec"
    command: str  # its whole command line, arguments joined by spaces, secrets redacted
    seen_wall_s: float  # when it was read (Unix seconds)
