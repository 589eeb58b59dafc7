"""Who brings vLLM back when its process is gone, as the platform tells it. Pure data.

A vLLM that nothing listens for is usually being restarted: systemd's `Restart=` or the kubelet is reloading
it, and a second restart from the sidecar would only start the load over. But not always: with `--actuator
exec` the sidecar is vLLM's only supervisor, and systemd does not restart a unit whose vLLM exited 0 (as vLLM
does after its engine died) under `Restart=on-failure`. The shell asks the restart adapter while vLLM is gone;
the policy waits briefly when nobody else will start it, and long when someone is. A vLLM its operator stopped
on purpose is left stopped: starting it again would undo what a person just did.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Restarter(StrEnum):
    SIDECAR = "sidecar"  # nobody else: the exec adapter, a systemd unit stopped with no job queued
    SUPERVISOR = "supervisor"  # a supervisor is at it: systemd's auto-restart or a queued start, the kubelet
    OPERATOR = "operator"  # stopped on purpose (`systemctl stop`): nobody restarts it, the sidecar neither
    UNKNOWN = "unknown"  # cannot tell: no adapter, or the platform did not answer


@dataclass(frozen=True, slots=True, kw_only=True)
class Supervision:
    restarter: Restarter
    detail: str  # one line: what the platform said, e.g. "unit vllm.service inactive (dead), no job queued"
