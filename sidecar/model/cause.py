"""Why vLLM died, as its own last log lines say it (read with the doctor's log reader). Pure data.

A `CrashCause` travels with the notifications about a death or a restart (webhook, Slack, Kubernetes Event)
and is shown in /status. When the log could not be read, or says nothing the doctor recognises, `cause`
is None and `summary` is the one line that says why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagChange:
    """One recommended change to vLLM's command line, environment or pod spec, as the doctor gives it."""

    flag: str  # "--gpu-memory-utilization", "PYTORCH_CUDA_ALLOC_CONF", "terminationGracePeriodSeconds"
    value: int | float | str  # "" for a switch that takes no value (--enforce-eager)
    why: str  # the arithmetic
    pasted: str  # ready to paste: "--gpu-memory-utilization 0.87", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    # The value the start that died ran with, where its log states it (or implies it: a default absent from
    # vLLM's non-default arguments); None when unknown. The change's direction is known only with it.
    current: int | float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashCause:
    cause: str | None  # the doctor's cause ("configuration_overshoot", "kv_cache_blowout", ...); None: unknown
    severity: str | None  # the finding's severity ("critical", "warning"); None when the cause is unknown
    summary: str  # one line: the finding's summary, or why the cause is unknown
    evidence: tuple[str, ...]  # the lines of the log (and of the platform) the finding rests on
    recommendations: tuple[FlagChange, ...]
    source: str  # where the log was read: "journal of vllm.service (system), invocation 2a14…", "file /x.log"
    read_wall_time_s: float  # when it was read (Unix seconds)
    steps: tuple[str, ...] = ()  # what to do that is no flag value: a relative change, what to look for
    # Of the start read: whether it crashed (a CUDA OOM, a refused start, a dead engine), and the values it ran
    # with of the flags the sidecar may change (--remediate), where its log states them.
    crashed: bool = False
    ran_with: tuple[tuple[str, float], ...] = ()

    def value_of(self, flag: str) -> float | None:
        return next((value for name, value in self.ran_with if name == flag), None)

    @property
    def known(self) -> bool:
        return self.cause is not None

    def line(self) -> str:
        """One line for chat and Events: `cause <name>: <summary>; change <flags>`, or `cause unknown: <why>`."""
        if self.cause is None:
            return f"cause unknown: {self.summary}"
        if self.recommendations:
            return f"cause {self.cause}: {self.summary}; change " + ", ".join(r.pasted for r in self.recommendations)
        step = f"; next: {self.steps[0]}" if self.steps else ""
        return f"cause {self.cause}: {self.summary}{step}"

    @classmethod
    def unknown(cls, why: str, *, source: str, wall_time_s: float) -> CrashCause:
        """A cause that could not be read, and why (one line)."""
        return cls(
            cause=None,
            severity=None,
            summary=" ".join(why.split()),
            evidence=(),
            recommendations=(),
            source=source,
            read_wall_time_s=wall_time_s,
        )
