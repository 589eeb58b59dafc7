"""The policy's state machine: one `Decision` per tick, per procedure step and per manual override. Pure.

No I/O, no logging, no clock: both clocks come in as arguments, so a recorded series replays identically.
The `Policy` object holds only memory of earlier ticks (streaks, when a pause began, health history); the
restart ledger is passed in and handed back, and the shell persists it.

Rules in order of precedence on a tick:
1. A restart in progress: only its procedure advances (see `procedure`).
2. Startup grace: until vLLM has been healthy and polled once since the sidecar started, nothing is done,
   however long loading takes (a loading vLLM and a dead one look alike; only the first is normal at start).
3. Stale or missing data (`data_age_s` None or over stale_after_s): hold; no pause, resume or restart,
   streaks start over. Except the engine-dead rule, which is about /health itself (a dead vLLM is no data).
4. Admission: pause on any pause condition; resume when all are clear, KV usage is back under the resume
   threshold and the pause has lasted min_paused_s. A manual pause holds until a manual resume.
5. Restart: engine dead, engine hung, OOM forecast, pressure events (if enabled), in that order, each through
   the guards: failed-restart latch, hourly budget (its notification once per exhaustion), cooldown,
   "not now" backoff, and for the forecast the minimum vLLM uptime (as this policy observed it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.policy import rules
from sidecar.policy.admission import Admission
from sidecar.policy.decision import (
    Action,
    ActionKind,
    Decision,
    Guard,
    ManualAction,
    PauseRule,
    PolicyState,
    ProcedureEvent,
    RestartReason,
)
from sidecar.policy.guards import GuardView, RecordClock, budget_block, cooldown_block, guard_view
from sidecar.policy.ledger import RestartLedger
from sidecar.policy.observation import Observation
from sidecar.policy.probe import EngineProbe, ProbeOutcome
from sidecar.policy.procedure import Outcome, Procedure, Stage, Step
from sidecar.policy.rules import Finding, RestartCause, seconds
from sidecar.policy.settings import PolicySettings
from sidecar.policy.vitals import Vitals


@dataclass(frozen=True, slots=True, kw_only=True)
class _Moment:
    """What every decision is stamped with, taken when the call begins."""

    now_s: float
    wall_s: float
    ledger: RestartLedger
    was_paused: bool


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


class Policy:
    def __init__(self, settings: PolicySettings | None = None) -> None:
        self.settings = settings or PolicySettings()
        self._procedure = Procedure(self.settings)
        self._clock = RecordClock()
        self._starting = True
        self._vitals = Vitals(self.settings)
        self._healthy_again_s: float | None = None  # vLLM back from the last restart: the cooldown's start
        self._waiting_streaks: dict[str, int] = {}
        self._oom_streaks: dict[int, int] = {}
        self._admission = Admission(self.settings)
        self._budget_notified = False
        self._pressure: list[Finding] = []
        self._blocked: tuple[RestartCause, Guard, str] | None = None  # a restart that was due, the guard that said no
        self._state = PolicyState.STARTING
        self._probe = EngineProbe(self.settings)

    @property
    def admission_paused(self) -> bool:
        return self._admission.paused

    def decide(self, observation: Observation, ledger: RestartLedger) -> Decision:
        """One tick. The ledger is only read (it changes on `procedure_event` alone)."""
        obs, s, now = observation, self.settings, observation.now_s
        moment = _Moment(now_s=now, wall_s=obs.wall_time_s, ledger=ledger, was_paused=self._admission.paused)
        recovered = self._vitals.track(obs, restarting=self._procedure.active)
        fresh = obs.data_age_s is not None and obs.data_age_s <= s.stale_after_s
        self._count_streaks(obs, fresh)
        self._pressure, self._blocked = [], None
        if self._procedure.active:
            step = self._procedure.tick(obs, self._vitals.failing_for(now))
            return self._finish(moment, self._apply(step, now), step.reason)
        if self._starting:
            if not (self._vitals.seen_healthy and self._vitals.seen_polled):
                seen = f"healthy: {_yes(self._vitals.seen_healthy)}, polled: {_yes(self._vitals.seen_polled)}"
                reason = f"startup grace, no action until vLLM has been healthy and polled once ({seen})"
                return self._finish(moment, [], reason)
            self._starting = False
        actions = [Action(kind=ActionKind.NOTIFY_VLLM_RECOVERED, reason=recovered)] if recovered else []
        resumed = self._after_failed_restart(obs, fresh)
        probe_line = self._probe.waiting_line(now) or self._probe.wedge(obs.derived, now)
        held = self._admission.evaluate(obs.derived, now, self._waiting_streaks, probe_line) if fresh else ""
        if fresh and self._admission.auto is None:
            self._pressure = rules.pressure_findings(obs.derived, s, self._waiting_streaks, self._oom_streaks)
        resumed = resumed or (held if not self._admission.paused and moment.was_paused else "")
        failing = self._vitals.failing_for(now)
        if failing is not None and failing < s.dead_after_s:
            self._pressure.append(Finding(rule=None, text=f"vLLM /health failing for {seconds(failing)}"))
        view = self._view(ledger, now, obs.wall_time_s)  # after a recovery, which may start a cooldown
        candidate = self._candidate(obs, fresh)
        if candidate is not None:
            begun, restart_actions = self._restart_or_block(candidate, now, view)
            actions += restart_actions
            if begun:
                return self._finish(moment, actions, actions[-1].reason)
        if view.budget_wait_s == 0:
            self._budget_notified = False
        if fresh and obs.poll_ok and obs.healthy:
            actions += self._probe_if_due(obs)
        reason = self._quiet_reason(obs, fresh, held, view)
        return self._finish(moment, actions, reason, resumed)

    def _after_failed_restart(self, obs: Observation, fresh: bool) -> str:
        """After a failed or refused restart, vLLM answering ends the procedure's hold: the line, else ''."""
        if self._admission.procedure is None or not (fresh and obs.poll_ok and obs.healthy):
            return ""
        self._admission.procedure = None
        if self._procedure.latch_clears_on_recovery:
            self._procedure.clear_latch()
            self._healthy_again_s = obs.now_s
        return "vLLM answers healthy again after the failed restart"

    def _probe_if_due(self, obs: Observation) -> list[Action]:
        due = self._probe.due(obs.derived, obs.now_s)
        if due is None:
            return []
        self._probe.sent(obs.now_s)
        kind = ActionKind.WARM_UP_ENGINE if due.warm_up else ActionKind.PROBE_ENGINE
        return [Action(kind=kind, reason=due.line, cause=PauseRule.ENGINE_STALLED if due.stalled else None)]

    def procedure_event(
        self, event: ProcedureEvent, now_s: float, wall_s: float, ledger: RestartLedger, detail: str = ""
    ) -> tuple[Decision, RestartLedger]:
        """A step of the restart reported by the shell (`detail`: the adapter's one line). The ledger comes
        back with the restart recorded on RESTART_ACCEPTED; persist it then."""
        was_paused = self._admission.paused
        step = self._procedure.event(event, now_s, wall_s, detail)
        if step.record is not None:
            ledger = ledger.record(step.record)
            self._clock.pin(step.record, now_s)
        actions = self._apply(step, now_s)
        moment = _Moment(now_s=now_s, wall_s=wall_s, ledger=ledger, was_paused=was_paused)
        return self._finish(moment, actions, step.reason), ledger

    def probe_event(
        self, outcome: ProbeOutcome, now_s: float, wall_s: float, ledger: RestartLedger, detail: str = ""
    ) -> Decision:
        """The engine probe's answer, reported by the shell (`detail`: what came back, one line). The next tick
        acts on it: a wedge proven here restarts vLLM there, through the guards."""
        moment = _Moment(now_s=now_s, wall_s=wall_s, ledger=ledger, was_paused=self._admission.paused)
        result = self._probe.finish(outcome, now_s, detail)
        if result is None:
            reason = f"probe answer ignored ({outcome}): no probe is out (vLLM was restarted since)"
        else:
            took = seconds(result.finished_s - result.sent_s)
            verdict = {
                ProbeOutcome.ANSWERED: "the engine works",
                ProbeOutcome.NO_ANSWER: "the engine is wedged unless it makes progress now",
                ProbeOutcome.INCONCLUSIVE: "no evidence either way; the stall alone decides",
            }[outcome]
            reason = f"probe {outcome} after {took}: {detail}; {verdict}"
        return self._finish(moment, [], reason)

    def manual(
        self, action: ManualAction, now_s: float, wall_s: float, ledger: RestartLedger, detail: str = ""
    ) -> Decision:
        """An admin override. Pause holds until a manual resume. Resume lifts every pause and the failed
        latch (the rules apply again from the next tick). Restart drains first, bypasses budget, cooldown and
        grace, and is recorded in the ledger like any restart. Refused while a restart is in progress."""
        moment = _Moment(now_s=now_s, wall_s=wall_s, ledger=ledger, was_paused=self._admission.paused)
        by = f" ({detail})" if detail else ""
        actions: list[Action] = []
        if action is ManualAction.PAUSE:
            self._admission.manual = True
            reason = f"admission paused by hand{by}; held until a manual resume"
        elif self._procedure.active:
            reason = f"manual {action} refused: a restart is in progress ({self._procedure.stage})"
        elif action is ManualAction.RESUME:
            self._admission.release_all()
            self._procedure.clear_latch()
            reason = f"admission resumed by hand{by}; the automatic rules apply again from the next tick"
        else:
            self._procedure.clear_latch()
            self._admission.procedure = f"restarting vLLM (manual){by}"
            actions = self._procedure.begin(RestartReason.MANUAL, f"restart asked by hand{by}", now_s)
            reason = actions[-1].reason
        return self._finish(moment, actions, reason, reason)

    def restart_for_flags(self, text: str, now_s: float, wall_s: float, ledger: RestartLedger) -> Decision:
        """A restart that applies flags the sidecar changed for vLLM's next start (--remediate). Asked only for a
        vLLM that does not serve (its start failed), so there is nothing to drain. Like a manual restart it
        bypasses budget, cooldown and grace (the changes have their own daily budget) and is recorded in the
        ledger; it supersedes a restart whose vLLM is not healthy yet (that start failed), and is refused while
        a restart is draining or with the adapter: the caller asks again on a later tick."""
        moment = _Moment(now_s=now_s, wall_s=wall_s, ledger=ledger, was_paused=self._admission.paused)
        actions: list[Action] = []
        if self._procedure.active and not self._procedure.awaiting_health:
            reason = f"restart for changed flags refused: a restart is in progress ({self._procedure.stage})"
        else:
            self._procedure.abandon()
            self._procedure.clear_latch()
            self._admission.procedure = f"restarting vLLM ({RestartReason.FLAGS_CHANGED}): {text}"
            actions = self._procedure.begin(RestartReason.FLAGS_CHANGED, text, now_s)
            reason = actions[-1].reason
        return self._finish(moment, actions, reason, reason)

    def _count_streaks(self, obs: Observation, fresh: bool) -> None:
        if not fresh:  # a streak broken by missing data is no evidence about now
            self._waiting_streaks, self._oom_streaks = {}, {}
        elif obs.poll_ok:  # a repeated reading is no new evidence: streaks count polls, not ticks
            self._waiting_streaks = rules.next_waiting_streaks(self._waiting_streaks, obs.derived, self.settings)
            self._oom_streaks = rules.next_oom_streaks(self._oom_streaks, obs.derived, self.settings)

    def _restart_or_block(self, candidate: RestartCause, now_s: float, view: GuardView) -> tuple[bool, list[Action]]:
        """Begin the restart (True, its first actions), or note the guard that blocks it (False, and the
        budget notification the first time the budget is what blocks)."""
        blocked = self._block(candidate, now_s, view)
        if blocked is None:
            self._admission.procedure = f"restarting vLLM ({candidate.reason}): {candidate.text}"
            return True, self._procedure.begin(candidate.reason, candidate.text, now_s)
        self._blocked = (candidate, *blocked)
        if blocked[0] not in (Guard.BUDGET, Guard.DISABLED) or self._budget_notified:
            return False, []
        self._budget_notified = True  # once per exhaustion, not on every tick the restart stays due
        text = f"{blocked[1]}; restart due: {candidate.text}"
        return False, [Action(kind=ActionKind.NOTIFY_BUDGET_EXHAUSTED, reason=text, cause=candidate.reason)]

    def _view(self, ledger: RestartLedger, now_s: float, wall_s: float) -> GuardView:
        aged = self._clock.aged(ledger, now_s, wall_s)
        since = None if self._healthy_again_s is None else now_s - self._healthy_again_s
        return guard_view(aged, self.settings, wall_s, since)

    def _candidate(self, obs: Observation, fresh: bool) -> RestartCause | None:
        s, dead = self.settings, self._vitals.dead(obs)
        if dead is not None:
            return RestartCause(reason=RestartReason.ENGINE_DEAD, text=dead)
        if not fresh:
            return None
        wedge = self._probe.wedge(obs.derived, obs.now_s)
        found = rules.hung_cause(obs.derived, s, wedge=wedge, stall_alone=not self._probe.tells)
        found = found or rules.oom_cause(obs.derived, s, self._oom_streaks)
        pauses = self._admission.recent_pauses(obs.now_s)
        if found is None and s.pressure_events_restart and pauses >= s.pressure_events:
            text = f"{pauses} pressure events (automatic pauses) in {seconds(s.pressure_window_s)}"
            found = RestartCause(reason=RestartReason.PRESSURE_EVENTS, text=text)
        return found

    def _block(self, candidate: RestartCause, now_s: float, view: GuardView) -> tuple[Guard, str] | None:
        """The first guard that refuses this automatic restart, with its line; None when all allow it."""
        if self._procedure.latched is not None:
            return (
                Guard.FAILED_RESTART,
                f"automatic restarts are off after a failed restart ({self._procedure.latched})",
            )
        budget = budget_block(view, self.settings)
        if budget is not None:
            return (Guard.DISABLED if self.settings.max_restarts_per_hour == 0 else Guard.BUDGET), budget
        cooldown = cooldown_block(view)
        if cooldown is not None:
            return Guard.COOLDOWN, cooldown
        refused = self._procedure.retry_block(now_s)
        if refused is not None:
            return Guard.PLATFORM_REFUSED, refused
        if candidate.reason is RestartReason.OOM_FORECAST:
            uptime, needed = self._vitals.uptime(now_s), self.settings.min_uptime_for_forecast_restart_s
            if uptime < needed:
                # Whole seconds down: 39.6 s rounded would read "40 s < 40 s".
                text = (
                    f"vLLM up only {seconds(math.floor(uptime))} < {seconds(needed)} before a forecast-driven restart"
                )
                return Guard.MIN_UPTIME, text
        return None

    def _apply(self, step: Step, now_s: float) -> list[Action]:
        """What a procedure step means for the rest of the policy's memory."""
        if step.outcome is Outcome.ACCEPTED:
            self._probe.forget()
            # A new vLLM: earlier health, streaks, pauses and uptime describe the old process.
            self._vitals.restart_accepted()
            self._waiting_streaks, self._oom_streaks = {}, {}
            self._admission.forget_history()
        elif step.outcome is Outcome.DONE:
            self._admission.procedure, self._healthy_again_s, self._starting = None, now_s, False
            self._vitals.restart_done(now_s)
        elif step.outcome in (Outcome.NOT_NOW, Outcome.FAILED):
            self._admission.procedure = f"{step.reason}; admission held until vLLM answers healthy"
        return list(step.actions)

    def _quiet_reason(self, obs: Observation, fresh: bool, held: str, view: GuardView) -> str:
        prefix = f"failed: {self._procedure.latched}; " if self._procedure.latched else ""
        down = self._vitals.down_line(obs)
        if self._blocked is not None:
            line = f"would restart ({self._blocked[0].reason}): {self._blocked[0].text}; but {self._blocked[2]}"
        elif down is not None and self._vitals.is_down(obs.now_s):
            line = down
        elif not fresh:
            age = "vLLM never polled" if obs.data_age_s is None else f"last poll {seconds(obs.data_age_s)} ago"
            line = f"holding, no fresh data ({age}, stale after {seconds(self.settings.stale_after_s)})"
            if self._admission.paused:
                line += "; admission stays paused"
        elif self._admission.manual:
            line = "paused by hand; held until a manual resume"
        elif held:
            line = held
        elif self._pressure:
            line = f"pressure: {self._pressure[0].text}"
        elif view.cooldown_remaining_s is not None:
            line = f"cooldown: automatic restarts allowed again in {seconds(view.cooldown_remaining_s)}"
        else:
            line = "normal: no condition met"
        return prefix + line

    def _finish(self, moment: _Moment, actions: list[Action], reason: str, resumed: str = "") -> Decision:
        # The guard values after this step: a restart just recorded or just completed counts already.
        view = self._view(moment.ledger, moment.now_s, moment.wall_s)
        paused, was_paused = self._admission.paused, moment.was_paused
        if paused and not was_paused:
            cause = self._admission.cause(self._procedure.reason)
            text = self._admission.reason or reason
            actions.insert(0, Action(kind=ActionKind.PAUSE_ADMISSION, reason=text, cause=cause))
        elif was_paused and not paused:
            actions.insert(0, Action(kind=ActionKind.RESUME_ADMISSION, reason=resumed or reason))
        previous, self._state = self._state, self._current_state(view, moment.now_s)
        blocked = self._blocked
        restart_reason = self._procedure.reason if self._procedure.active or self._procedure.latched else None
        return Decision(
            state=self._state,
            previous_state=previous,
            admission_paused=paused,
            pause_reason=self._admission.reason,
            actions=tuple(actions),
            reason=reason,
            would_restart_but=blocked[2] if blocked else None,
            blocked_by=blocked[1] if blocked else None,
            restart_reason=blocked[0].reason if blocked else restart_reason,
            cooldown_remaining_s=view.cooldown_remaining_s,
            restarts_in_budget_window=view.restarts_in_window,
            manual_pause=self._admission.manual,
            now_s=moment.now_s,
            wall_time_s=moment.wall_s,
        )

    def _current_state(self, view: GuardView, now_s: float) -> PolicyState:  # noqa: PLR0911 - one return per state, by precedence
        stage = self._procedure.stage
        if stage is Stage.DRAINING:
            return PolicyState.DRAINING
        if stage is not Stage.IDLE:
            return PolicyState.RESTARTING
        if self._procedure.latched is not None:
            return PolicyState.FAILED
        if self._starting:
            return PolicyState.STARTING
        if self._vitals.is_down(now_s):
            return PolicyState.DOWN
        if self._admission.paused:
            return PolicyState.PAUSED
        if self._pressure or self._blocked:
            return PolicyState.PRESSURE
        if view.cooldown_remaining_s is not None:
            return PolicyState.COOLDOWN
        return PolicyState.NORMAL
