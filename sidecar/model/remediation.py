"""What the sidecar changed in vLLM's flags for its next start (`--remediate`), step by step. Pure data.

Each `Step` is one flag changed by one bounded step, from the value vLLM's crashed start ran with to the value
the doctor computed, kept with the cause and the arithmetic. The steps, oldest first, are the whole record:
the flags file (what vLLM's next start reads) is replayed from them (`sidecar.policy.remediation.flags_in_effect`),
so the file and the record cannot disagree. docs/remediation.md describes both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The flags the sidecar may set: numbers the doctor sizes with arithmetic and whose direction it knows. A
# parallelism, a quantization or a dtype changes what the model needs from the hardware: a person decides.
REMEDIABLE: dict[str, type[int] | type[float]] = {
    "--gpu-memory-utilization": float,
    "--max-model-len": int,
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,
}
# What became of a fix, as the metric counts it: set (or, in dry-run, would be), proved, taken back, not allowed.
OUTCOMES = ("applied", "would_apply", "confirmed", "reverted", "refused")
FLAGS_VARIABLE = "VLLM_SIDECAR_FLAGS"  # the flags file's one variable: vLLM's unit appends $VLLM_SIDECAR_FLAGS


class StepState(StrEnum):
    PENDING = "pending"  # set; waits for vLLM to be healthy, then for the window to pass without the cause
    CONFIRMED = "confirmed"  # vLLM was healthy through the window: the value stays
    REVERTED = "reverted"  # it did not help (or a person took it back): the flags file is as before it


@dataclass(frozen=True, slots=True, kw_only=True)
class Allowance:
    """A flag the sidecar may change, and the range it may set it within (both ends included)."""

    flag: str
    low: float
    high: float

    def words(self) -> str:
        return f"{self.flag} {self.low:g}..{self.high:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    flag: str
    before: float  # the value vLLM's failed start ran with (its log's)
    after: float  # the value set for the next start
    file_before: float | None  # the flags file's value for this flag before the step (None: not in the file)
    cause: str  # the doctor's cause ("kv_cache_blowout")
    why: str  # the doctor's arithmetic
    wall_time_s: float  # when it was set
    state: StepState
    outcome: str = ""  # one line: why it was confirmed or reverted
    resolved_wall_time_s: float | None = None
    held: bool = False  # reverted: the sidecar changes this flag no more until a person releases it

    @property
    def direction(self) -> int:
        return 1 if self.after > self.before else -1

    def diff(self) -> str:
        """`--max-model-len 2048 -> 992`."""
        return f"{self.flag} {_shown(self.flag, self.before)} -> {_shown(self.flag, self.after)}"


def shown(flag: str, value: float) -> str:
    """A flag's value as vLLM's command line takes it: an integer for the integer flags."""
    return _shown(flag, value)


def _shown(flag: str, value: float) -> str:
    if REMEDIABLE.get(flag) is int:
        return str(int(value))
    return f"{value:g}"
