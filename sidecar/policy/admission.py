"""Who holds admission paused, and the automatic pause/resume rule with its hysteresis and dwell. Pure.

Three holders, any one of which keeps /readyz at 503: the automatic rule, a manual pause (held until a
manual resume, whatever the metrics say), and the restart procedure (from the drain until vLLM is back, or
after a failed restart until vLLM answers healthy). The /readyz body names the most specific holder.
"""

from __future__ import annotations

from sidecar.model.derived import Derived
from sidecar.policy.decision import PauseRule, RestartReason
from sidecar.policy.rules import Finding, compare, pause_findings, resume_blockers, seconds
from sidecar.policy.settings import PolicySettings


class Admission:
    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.auto: Finding | None = None  # the automatic pause's leading condition, while paused by the rule
        self.auto_since_s = 0.0
        self.manual = False
        self.procedure: str | None = None  # why the restart procedure holds it
        # What holds the automatic pause (its leading condition), since when, and when it last cleared: every
        # hold and every resume says which condition held it and for how long.
        self._holder: Finding | None = None
        self._holder_since_s = 0.0
        self._cleared_s: float | None = None
        self._pauses_s: list[float] = []  # when automatic pauses began, for the pressure-events rule

    @property
    def paused(self) -> bool:
        return self.procedure is not None or self.manual or self.auto is not None

    @property
    def reason(self) -> str | None:
        """One line for the /readyz body; None while admitting."""
        if self.procedure is not None:
            return self.procedure
        if self.manual:
            return "paused by hand; held until a manual resume"
        return self.auto.text if self.auto is not None else None

    def cause(self, restart_reason: RestartReason | None) -> PauseRule | RestartReason | None:
        if self.procedure is not None:
            return restart_reason
        if self.manual:
            return PauseRule.MANUAL
        return self.auto.rule if self.auto is not None else None

    def release_all(self) -> None:
        self.auto, self.manual, self.procedure = None, False, None

    def forget_history(self) -> None:
        """After a restart: the old process's pause and its pressure events no longer say anything."""
        self.auto, self._pauses_s, self._holder = None, [], None

    def recent_pauses(self, now_s: float) -> int:
        """Automatic pauses that began within pressure_window_s."""
        self._pauses_s = [t for t in self._pauses_s if now_s - t < self._settings.pressure_window_s]
        return len(self._pauses_s)

    def evaluate(
        self, derived: Derived, now_s: float, waiting_streaks: dict[str, int], probe_line: str | None = None
    ) -> str:
        """The automatic rule on fresh data: pause, hold or resume. Returns the line explaining it ('' when
        not paused by the rule and nothing calls for it). `probe_line`: see `rules.pause_findings`."""
        s = self._settings
        found = pause_findings(derived, s, waiting_streaks, probe_line)
        if found:
            if self.auto is None:
                self.auto_since_s = now_s
                self._pauses_s.append(now_s)
                self._holder = None
            self._hold(found[0], now_s)
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            held_s = now_s - self._holder_since_s
            since = f" (since {seconds(held_s)})" if held_s > 0 else ""
            self.auto = Finding(rule=found[0].rule, text=found[0].text + more + since)
            return f"paused: {self.auto.text}"
        if self.auto is None:
            return ""
        paused_for = now_s - self.auto_since_s
        blockers = resume_blockers(derived, s, probe_line)
        if blockers:
            self._hold(blockers[0], now_s)
            return f"holding the pause: {blockers[0].text} (since {seconds(now_s - self._holder_since_s)})"
        if self._cleared_s is None:
            self._cleared_s = now_s
        if paused_for < s.min_paused_s:
            return (
                f"holding the pause: paused {seconds(paused_for)} of at least {seconds(s.min_paused_s)}; "
                f"{self._last_held(now_s)}"
            )
        self.auto = None
        usage = [e.kv_cache_usage_ratio for e in derived.engines if e.kv_cache_usage_ratio is not None]
        kv = ""
        if usage:
            high, limit = compare(max(usage), s.resume_kv_usage_ratio)
            kv = f"KV cache usage {high} <= {limit} on every engine, "
        return (
            f"resumed, all clear after {seconds(paused_for)} paused: {kv}no pause condition holds; "
            f"{self._last_held(now_s)}"
        )

    def _hold(self, finding: Finding, now_s: float) -> None:
        """`finding` holds the pause now: a new leading condition starts its own 'since'."""
        if self._holder is None or self._holder.rule != finding.rule or self._cleared_s is not None:
            self._holder_since_s = now_s
        self._holder, self._cleared_s = finding, None

    def _last_held(self, now_s: float) -> str:
        """'held by <the last condition> for N s, clear for M s'."""
        if self._holder is None:
            return "no condition held it"
        cleared = self._cleared_s if self._cleared_s is not None else now_s
        return (
            f"held by {self._holder.text} for {seconds(cleared - self._holder_since_s)}, "
            f"clear for {seconds(now_s - cleared)}"
        )
