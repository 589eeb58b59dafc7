"""The drain-and-restart procedure as a small state machine inside the policy. Pure, no I/O.

Pause admission -> wait for 0 running (at most drain_timeout_s) -> restart through the adapter -> wait for
/health 200 and a successful poll (at most startup_timeout_s) -> resume. Each step is reached either from a
tick (`tick`: the policy sees running reach 0, a timeout pass, vLLM come back) or from the shell (`event`:
the adapter's outcome, or a step the shell watched itself); an event that does not fit the current stage is
ignored and says so, so a step seen twice is never applied twice.

Every failure ends in a clear place, never a loop:
- drain timeout: restart anyway. With --shutdown-timeout > 0, vLLM >= 0.18 lets in-flight requests finish
  on SIGTERM, and a drain that does not finish is usually the hung engine we are restarting.
- restart not now (429): back to the tick rules; the next automatic attempt waits cooldown_base_s, doubling
  per refusal in a row (reset by an accepted restart).
- restart failed, or no answer from the adapter within startup_timeout_s: `latched` (the FAILED state).
  Automatic restarts stay off until a manual restart or resume: a 403 or a missing unit will not fix itself.
- startup timeout: `latched` too, but cleared when vLLM is seen healthy again by itself (it was only slow).
In each failure admission stays paused until vLLM answers healthy with a fresh poll (the policy's part).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.model.text import plural
from sidecar.policy.decision import Action, ActionKind, ProcedureEvent, RestartReason
from sidecar.policy.ledger import RestartRecord
from sidecar.policy.observation import Observation
from sidecar.policy.rules import seconds
from sidecar.policy.settings import PolicySettings


class Stage(StrEnum):
    IDLE = "idle"
    DRAINING = "draining"
    AWAITING_ADAPTER = "awaiting_adapter"  # the RESTART action is out; the shell reports its outcome
    AWAITING_HEALTH = "awaiting_health"  # accepted; waiting for /health 200 and a poll


class Outcome(StrEnum):
    HOLD = "hold"
    IGNORED = "ignored"
    RESTART_REQUESTED = "restart_requested"
    ACCEPTED = "accepted"
    DONE = "done"
    NOT_NOW = "not_now"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    outcome: Outcome
    reason: str
    actions: tuple[Action, ...] = ()
    record: RestartRecord | None = None  # with ACCEPTED: what the ledger gets


class Procedure:
    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.stage = Stage.IDLE
        self.reason: RestartReason | None = None  # of the restart in progress, or the last one
        self.text = ""  # the rule's line that started it
        self.latched: str | None = None  # why automatic restarts are off (the FAILED state)
        self.latch_clears_on_recovery = False
        self._since_s = 0.0  # when the current stage began
        self._began_s = 0.0  # when the restart began (its drain), to report how long it took in all
        self._requested_s = 0.0  # when the adapter was asked
        self._refusals = 0  # "not now" answers in a row
        self._retry_after_s: float | None = None

    @property
    def active(self) -> bool:
        return self.stage is not Stage.IDLE

    @property
    def awaiting_health(self) -> bool:
        return self.stage is Stage.AWAITING_HEALTH

    def abandon(self) -> None:
        """Stop waiting for the restart in progress to bring vLLM up (another restart takes over)."""
        self.stage = Stage.IDLE

    def begin(self, reason: RestartReason, text: str, now_s: float) -> list[Action]:
        self.stage, self.reason, self.text, self._since_s = Stage.DRAINING, reason, text, now_s
        self._began_s = now_s
        self.latched = None
        # A dead engine has nothing to drain; a hung one's requests cannot finish: waiting for them would only keep
        # a wedged engine up for the drain's whole timeout (measured on a real vLLM: 120 s for a running count that
        # never moved).
        undrainable = {
            RestartReason.ENGINE_DEAD: "engine dead, nothing to drain",
            RestartReason.ENGINE_HUNG: "engine hung, nothing will finish: no drain",
            RestartReason.FLAGS_CHANGED: "vLLM not serving, nothing to drain",
        }.get(reason)
        waits = f"waiting up to {seconds(self._settings.drain_timeout_s)} for running requests to finish"
        drain = Action(
            kind=ActionKind.DRAIN,
            reason=f"restart ({reason}) begins: {text}; admission paused, {'no drain' if undrainable else waits}",
            cause=reason,
        )
        if undrainable is not None:
            return [drain, *self._request(now_s, undrainable).actions]
        return [drain]

    def retry_block(self, now_s: float) -> str | None:
        if self._retry_after_s is None or now_s >= self._retry_after_s:
            return None
        return f"the platform refused the last restart for now; next attempt in {seconds(self._retry_after_s - now_s)}"

    def clear_latch(self) -> None:
        self.latched, self.latch_clears_on_recovery = None, False

    def tick(self, obs: Observation, failing_for_s: float | None) -> Step:
        """What this tick's observation settles; HOLD (with a progress line) when nothing."""
        if self.stage is Stage.DRAINING:
            return self._tick_draining(obs, failing_for_s)
        if self.stage is Stage.AWAITING_HEALTH:
            return self._tick_awaiting_health(obs)
        if self.stage is Stage.AWAITING_ADAPTER:
            elapsed = obs.now_s - self._since_s
            if elapsed >= self._settings.startup_timeout_s:
                return self._fail(f"the restart adapter gave no answer in {seconds(elapsed)}", clears=False)
            return Step(
                outcome=Outcome.HOLD, reason=f"restarting: waiting for the restart adapter ({seconds(elapsed)})"
            )
        return Step(outcome=Outcome.HOLD, reason="no restart in progress")

    def _tick_awaiting_health(self, obs: Observation) -> Step:
        elapsed = obs.now_s - self._since_s
        # A poll after the acceptance, not one the old process answered before it went.
        if obs.poll_ok and obs.healthy and obs.now_s > self._since_s:
            return self._done(obs.now_s)
        if elapsed >= self._settings.startup_timeout_s:
            return self._startup_timed_out(elapsed)
        return Step(
            outcome=Outcome.HOLD,
            reason=f"restarting: waiting for vLLM to be healthy and polled, {seconds(elapsed)} of at most "
            f"{seconds(self._settings.startup_timeout_s)}",
        )

    def _tick_draining(self, obs: Observation, failing_for_s: float | None) -> Step:
        s, now = self._settings, obs.now_s
        elapsed = now - self._since_s
        running = [e.requests_running for e in obs.derived.engines]
        # Drained only on a poll after the pause began: the load balancer needs one interval to notice 503.
        if obs.poll_ok and now > self._since_s and running and all(r == 0 for r in running):
            return self._request(now, "drained: 0 requests running")
        if failing_for_s is not None and failing_for_s >= s.dead_after_s:
            return self._request(now, f"vLLM not healthy for {seconds(failing_for_s)}, nothing to drain")
        stalled = [e.engine_stalled_seconds or 0.0 for e in obs.derived.engines] if obs.poll_ok else []
        if stalled and max(stalled) >= s.stall_pause_after_s:
            return self._request(
                now, f"no engine progress for {seconds(max(stalled))} during the drain, nothing will finish"
            )
        if elapsed >= s.drain_timeout_s:
            return self._drain_timed_out(now)
        known = sum(r for r in running if r is not None)
        return Step(
            outcome=Outcome.HOLD,
            reason=(
                f"draining: {plural(known, 'request', spec='g')} running, {seconds(elapsed)} of at most "
                f"{seconds(s.drain_timeout_s)}"
            ),
        )

    def event(self, event: ProcedureEvent, now_s: float, wall_s: float, detail: str) -> Step:  # noqa: PLR0911 - the transition table: one return per (stage, event) pair
        """A step reported by the shell; IGNORED when it does not fit the current stage."""
        said = f": {detail}" if detail else ""
        if self.stage is Stage.DRAINING and event is ProcedureEvent.DRAINED:
            return self._request(now_s, f"drained{said}")
        if self.stage is Stage.DRAINING and event is ProcedureEvent.DRAIN_TIMED_OUT:
            return self._drain_timed_out(now_s)
        # `reason` is set by begin(), which every stage but IDLE follows; the test only narrows the type.
        if self.stage is Stage.AWAITING_ADAPTER and event is ProcedureEvent.RESTART_ACCEPTED and self.reason:
            record = RestartRecord(wall_time_s=wall_s, reason=self.reason, detail=self.text, monotonic_s=now_s)
            self.stage, self._since_s = Stage.AWAITING_HEALTH, now_s
            self._refusals, self._retry_after_s = 0, None
            return Step(
                outcome=Outcome.ACCEPTED,
                reason=f"restart ({self.reason}) accepted by the adapter{said}; waiting up to "
                f"{seconds(self._settings.startup_timeout_s)} for vLLM to be healthy",
                record=record,
            )
        if self.stage is Stage.AWAITING_ADAPTER and event is ProcedureEvent.RESTART_NOT_NOW:
            self._refusals += 1
            wait = self._settings.cooldown_s(self._refusals)
            self._retry_after_s = now_s + wait
            self.stage = Stage.IDLE
            text = f"restart ({self.reason}) refused for now by the platform{said}; next attempt in {seconds(wait)}"
            notify = Action(kind=ActionKind.NOTIFY_RESTART_FAILED, reason=text, cause=self.reason)
            return Step(outcome=Outcome.NOT_NOW, reason=text, actions=(notify,))
        if self.stage is Stage.AWAITING_ADAPTER and event is ProcedureEvent.RESTART_FAILED:
            return self._fail(f"the restart adapter failed{said}", clears=False)
        if self.stage is Stage.AWAITING_HEALTH and event is ProcedureEvent.HEALTHY_AGAIN:
            return self._done(now_s)
        if self.stage is Stage.AWAITING_HEALTH and event is ProcedureEvent.STARTUP_TIMED_OUT:
            return self._startup_timed_out(now_s - self._since_s)
        return Step(
            outcome=Outcome.IGNORED, reason=f"ignored {event}: no step of the restart waits for it ({self.stage})"
        )

    def _request(self, now_s: float, how: str) -> Step:
        self.stage, self._since_s, self._requested_s = Stage.AWAITING_ADAPTER, now_s, now_s
        text = f"{how}; restarting vLLM ({self.reason}): {self.text}"
        restart = Action(kind=ActionKind.RESTART, reason=text, cause=self.reason)
        return Step(outcome=Outcome.RESTART_REQUESTED, reason=text, actions=(restart,))

    def _drain_timed_out(self, now_s: float) -> Step:
        return self._request(
            now_s,
            f"drain timed out after {seconds(self._settings.drain_timeout_s)} with requests still running, "
            "restarting anyway (with --shutdown-timeout > 0, vLLM >= 0.18 lets in-flight requests finish on "
            "SIGTERM; otherwise they are aborted)",
        )

    def _done(self, now_s: float) -> Step:
        self.stage = Stage.IDLE
        # Measured from the restart's start (its drain), not from when the adapter returned: a systemd restart
        # that takes 29 s to stop and start vLLM answers "done" only when vLLM is already back.
        drain, adapter = self._requested_s - self._began_s, self._since_s - self._requested_s
        text = (
            f"vLLM healthy again {seconds(now_s - self._began_s)} after the restart ({self.reason}) began: "
            f"drain {seconds(drain)}, restart adapter {seconds(adapter)}, then {seconds(now_s - self._since_s)} "
            "until healthy and polled"
        )
        done = Action(kind=ActionKind.NOTIFY_RESTART_DONE, reason=text, cause=self.reason)
        return Step(outcome=Outcome.DONE, reason=text, actions=(done,))

    def _startup_timed_out(self, elapsed_s: float) -> Step:
        return self._fail(
            f"vLLM not healthy {seconds(elapsed_s)} after the restart; admission stays paused, no automatic "
            "restart until vLLM recovers by itself or a manual action",
            clears=True,
        )

    def _fail(self, why: str, *, clears: bool) -> Step:
        self.stage = Stage.IDLE
        if not clears:
            why += "; automatic restarts are off until a manual restart or resume"
        self.latched, self.latch_clears_on_recovery = why, clears
        text = f"restart ({self.reason}) failed: {why}"
        notify = Action(kind=ActionKind.NOTIFY_RESTART_FAILED, reason=text, cause=self.reason)
        return Step(outcome=Outcome.FAILED, reason=text, actions=(notify,))
