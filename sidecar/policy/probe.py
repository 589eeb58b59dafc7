"""The engine probe: when to send vLLM one bounded 1-token completion, and what its answer proves. Pure.

Frozen counters do not tell a wedge from a quiet engine. vLLM's /health stays 200 while its EngineCore is
wedged, and an engine wedged while idle freezes its metrics at 0 running and 0 waiting while the requests
sent to it hang. So the policy asks the shell to send one completion with `max_tokens=1` for the served model:

- as soon as an engine with work has made no progress for `stall_pause_after_s`: the stall that pauses
  admission is evidence enough to ask;
- after `probe_after_s` without progress on an engine that reads idle (an idle server then costs one short
  completion every `probe_after_s`).

What the answer proves:
- answered: the engine works (a long prefill, not a hang); a pending hung restart is called off;
- no answer within `probe_timeout_s`, and no counter moved since it was sent: a wedge, and the hung restart
  goes ahead once the engine has been without progress for `hung_after_s`. A probe stuck behind a busy
  queue proves nothing: the queue's tokens move the counters;
- anything else (an HTTP error, an API key it lacks, no model, refused): no evidence either way; the hung
  rule falls back on the stall alone, over `hung_without_probe_after_s`, as with probes off.

The probe is never the first request a fresh vLLM sees (vLLM 0.32's CPU build crashed on a first prompt of 3
tokens or fewer): an engine that has generated no token yet gets a warm-up instead, a completion sized like a
real request, whose answer counts as the probe's.

While a probe has waited `stall_pause_after_s` for its answer, admission pauses: an engine that cannot answer
one token in that time would take every request it is sent into its queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.model.derived import Derived
from sidecar.policy.rules import engine_label, seconds
from sidecar.policy.settings import PolicySettings

_PROBING = "probing it with a 1-token completion"
_WARMING_UP = "warming it up with a 1-token completion sized like a real request (no token generated yet)"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DueProbe:
    line: str  # why, one line
    warm_up: bool = False  # a fresh vLLM's: sized like a real request, never the short probe
    stalled: bool = False  # asked because a stall with work paused admission, not as the idle routine


class EngineProbe:
    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.outstanding_since_s: float | None = None
        self.last: ProbeResult | None = None

    @property
    def enabled(self) -> bool:
        return self._settings.probe_after_s > 0

    def due(self, derived: Derived, now_s: float) -> DueProbe | None:
        """The probe to send now, or None. At most one in flight, at most one per `probe_after_s`."""
        s = self._settings
        if not self.enabled or self.outstanding_since_s is not None:
            return None
        if self.last is not None and now_s - self.last.sent_s < s.probe_after_s:
            return None
        if self.wedge(derived, now_s) is not None:
            return None  # the last one proved a wedge that still holds: another would only queue behind it
        stall_limit = min(s.stall_pause_after_s, s.hung_after_s)  # when the stall pauses, before any hung restart
        for e in derived.engines:
            if e.engine_stalled_seconds is not None and e.engine_stalled_seconds >= stall_limit:
                # Requests are in already: the probe is not the first this vLLM sees.
                stalled = f"{engine_label(e, derived)} made no progress for {seconds(e.engine_stalled_seconds)}"
                return DueProbe(line=f"{stalled} with requests waiting or running: {_PROBING}", stalled=True)
        # Idle, and no token generated since it started: a fresh vLLM, whose first request this would be.
        warm_up = bool(derived.engines) and all(e.generation_tokens_total == 0 for e in derived.engines)
        for e in derived.engines:
            if e.seconds_since_progress is not None and e.seconds_since_progress >= s.probe_after_s:
                quiet = f"{engine_label(e, derived)} made no progress for {seconds(e.seconds_since_progress)}"
                what = _WARMING_UP if warm_up else _PROBING
                return DueProbe(line=f"{quiet}: {what} (an engine wedged while idle reads idle)", warm_up=warm_up)
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
