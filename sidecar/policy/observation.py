"""What the shell feeds the policy each tick. Pure data.

Both clocks are arguments: `now_s` (monotonic) times every duration the policy measures, so a recorded series
replays identically; `wall_time_s` is only used to age the persisted restart ledger (see `ledger`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.model.derived import Derived
from sidecar.model.supervision import Restarter


class ObservationError(ValueError):
    """An observation the shell should never build (a clock that is not a number, a negative age)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    now_s: float  # monotonic seconds: never jumps
    wall_time_s: float  # Unix seconds: may jump
    poll_ok: bool  # vLLM's /metrics was read this tick
    vllm_healthy: bool | None  # vLLM's /health answered 200; None when it was not asked
    data_age_s: float | None  # seconds since the last successful poll; None when there never was one
    derived: Derived  # the values of the last successful poll (empty before the first)
    # Nothing listens at vLLM's address (connection refused): its process is gone, so a supervisor (systemd
    # Restart=, the kubelet) is most likely restarting it. Not the same as an engine dead inside a live server.
    vllm_down: bool = False
    vllm_slow: bool = False  # /health gave no answer in time: the same process, slow (`Snapshot.vllm_slow`)
    # Who restarts a vLLM that is gone (`sidecar.model.supervision`, asked only while it is): with nobody else,
    # the policy restarts it after down_unsupervised_after_s instead of leaving its supervisor down_after_s.
    restarter: Restarter = Restarter.UNKNOWN
    restarter_detail: str = ""  # one line: what the platform said, e.g. "unit vllm.service inactive, no job queued"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.now_s) and math.isfinite(self.wall_time_s)):
            raise ObservationError(f"clocks must be finite, got now_s={self.now_s} wall_time_s={self.wall_time_s}")
        if self.data_age_s is not None and not (math.isfinite(self.data_age_s) and self.data_age_s >= 0):
            raise ObservationError(f"data_age_s must be None or a finite number >= 0, got {self.data_age_s}")

    @property
    def healthy(self) -> bool:
        """Whether vLLM answers as alive: its /health, or, when /health was not asked, whether /metrics read."""
        return self.poll_ok if self.vllm_healthy is None else self.vllm_healthy
