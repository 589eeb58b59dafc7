"""The engine probe: when to send vLLM one bounded 1-token completion, and what its answer proves. Pure.

Frozen counters do not tell a wedge from a quiet engine. vLLM's /health stays 200 while its EngineCore is
wedged, and an engine wedged while idle freezes its metrics at 0 running and 0 waiting while the requests
sent to it hang. So when an engine has made no progress for `probe_after_s` (idle or not; an idle server then
costs one token a minute), and before any hung restart, the policy asks the shell to send one completion with
`max_tokens=1` for the served model:

- answered: the engine works (a long prefill, not a hang); a pending hung restart is called off;
- no answer within `probe_timeout_s` (generous: a busy engine must not be restarted for being slow), and no
  progress since it was sent: a wedge, and the hung restart goes ahead once the engine has been without
  progress for `hung_after_s`;
- anything else (an HTTP error, an API key it lacks, no model, refused): no evidence either way; the hung
  rule falls back on the stall alone (work and no progress for `hung_after_s`), as with probes off.

While a probe has waited `stall_pause_after_s` for its answer, admission pauses: an engine that cannot answer
one token in that time would take every request it is sent into its queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.model.derived import Derived
from sidecar.policy.rules import engine_label, seconds
from sidecar.policy.settings import PolicySettings


class ProbeOutcome(StrEnum):
    ANSWERED = "answered"  # the completion finished: the engine works
    NO_ANSWER = "no_answer"  # nothing within probe_timeout_s
    INCONCLUSIVE = "inconclusive"  # an HTTP error, no model, refused: says nothing about the engine


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    outcome: ProbeOutcome
    sent_s: float
    finished_s: float
    detail: str  # one line: what came back


class EngineProbe:
    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.outstanding_since_s: float | None = None
        self.last: ProbeResult | None = None

    @property
    def enabled(self) -> bool:
        return self._settings.probe_after_s > 0

    def due(self, derived: Derived, now_s: float) -> str | None:
        """The line for a probe to send now, or None. At most one in flight, at most one per probe_after_s."""
        s = self._settings
        if not self.enabled or self.outstanding_since_s is not None:
            return None
        if self.last is not None and now_s - self.last.sent_s < s.probe_after_s:
            return None
        stall_limit = min(s.probe_after_s, s.hung_after_s)  # before any hung restart
        for e in derived.engines:
            if e.engine_stalled_seconds is not None and e.engine_stalled_seconds >= stall_limit:
                return (
                    f"{engine_label(e, derived)} made no progress for {seconds(e.engine_stalled_seconds)} with "
                    "requests waiting or running: probing it with a 1-token completion"
                )
        for e in derived.engines:
            if e.seconds_since_progress is not None and e.seconds_since_progress >= s.probe_after_s:
                return (
                    f"{engine_label(e, derived)} made no progress for {seconds(e.seconds_since_progress)}: probing "
                    "it with a 1-token completion (an engine wedged while idle reads idle)"
                )
        return None

    def sent(self, now_s: float) -> None:
        self.outstanding_since_s = now_s

    def finish(self, outcome: ProbeOutcome, now_s: float, detail: str) -> ProbeResult | None:
        """Record the answer; None when no probe was out (an answer after a restart forgot it)."""
        if self.outstanding_since_s is None:
            return None
        self.last = ProbeResult(outcome=outcome, sent_s=self.outstanding_since_s, finished_s=now_s, detail=detail)
        self.outstanding_since_s = None
        return self.last

    def forget(self) -> None:
        """After a restart: the old process's answers say nothing about the new one."""
        self.outstanding_since_s, self.last = None, None

    def waiting_line(self, now_s: float) -> str | None:
        """While a probe has waited stall_pause_after_s for its answer: the pause's line."""
        since = self.outstanding_since_s
        if since is None or now_s - since < self._settings.stall_pause_after_s:
            return None
        return f"a 1-token probe completion has had no answer for {seconds(now_s - since)}"

    def wedge(self, derived: Derived, now_s: float) -> str | None:
        """The line proving a wedge: the last probe got no answer and no engine moved since it was sent."""
        last = self.last
        if last is None or last.outcome is not ProbeOutcome.NO_ANSWER:
            return None
        quiet = [e.seconds_since_progress for e in derived.engines if e.seconds_since_progress is not None]
        if not quiet or min(quiet) < now_s - last.sent_s:
            return None  # something moved after the probe was sent: the engine works
        return f"a 1-token probe completion got no answer in {seconds(last.finished_s - last.sent_s)}"

    @property
    def tells(self) -> bool:
        """Whether probes can tell a wedge here: on, and their last answer was not an HTTP error or the like."""
        return self.enabled and (self.last is None or self.last.outcome is not ProbeOutcome.INCONCLUSIVE)
