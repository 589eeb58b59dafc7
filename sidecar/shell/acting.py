"""Carries out the policy's decisions: readiness, the restart through the adapter, notifications, the ledger.

Does I/O through what it is given (the adapter, the notifier, the state file). Each tick it feeds the policy
an observation; the policy answers with a decision, which this applies. The adapter call runs as a task (a
restart can take minutes) whose outcome goes back to the policy as a procedure event. With --dry-run the
policy decides exactly as it would, everything is logged, exported and notified as "would", and nothing is
acted on: readiness stays 200, the adapter is asked for its dry-run answer, and the ledger is not written.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.base import Actuator, ActuatorOutcome, OutcomeStatus
from sidecar.actuators.log_source import Wanted
from sidecar.exporter.endpoints import Readiness
from sidecar.model.acting import ActingView
from sidecar.model.derived import Derived
from sidecar.model.incident import IncidentRef, Kind, Trigger
from sidecar.model.status import RecentDecision
from sidecar.model.supervision import Restarter
from sidecar.model.view import View
from sidecar.notify.message import Notification, NotificationKind
from sidecar.policy.decision import (
    Action,
    ActionKind,
    Decision,
    ManualAction,
    PolicyState,
    ProcedureEvent,
    RestartReason,
)
from sidecar.policy.machine import Policy
from sidecar.policy.observation import Observation
from sidecar.policy.presence import Presence
from sidecar.policy.probe import ProbeOutcome
from sidecar.shell.incident import IncidentRecorder
from sidecar.shell.ledger_store import LedgerStore
from sidecar.shell.probing import PROBE_ACTIONS, Prober, Probing
from sidecar.shell.state_file import StateFile
from sidecar.sources.probe import ProbeAnswer

_EMPTY = Derived(engines=(), gpus=(), problems=())
_OUTCOME_EVENTS = {
    OutcomeStatus.DONE: ProcedureEvent.RESTART_ACCEPTED,
    OutcomeStatus.DRY_RUN: ProcedureEvent.RESTART_ACCEPTED,  # so a dry run walks the whole procedure once
    OutcomeStatus.NOT_NOW: ProcedureEvent.RESTART_NOT_NOW,
    OutcomeStatus.FAILED: ProcedureEvent.RESTART_FAILED,
}
_NOTIFIED = {
    ActionKind.PAUSE_ADMISSION: NotificationKind.PAUSE,
    ActionKind.RESUME_ADMISSION: NotificationKind.RESUME,
    ActionKind.DRAIN: NotificationKind.RESTART_BEGIN,
    ActionKind.NOTIFY_RESTART_DONE: NotificationKind.RESTART_END,
    ActionKind.NOTIFY_RESTART_FAILED: NotificationKind.RESTART_FAILURE,
    ActionKind.NOTIFY_BUDGET_EXHAUSTED: NotificationKind.BUDGET_EXHAUSTED,
    ActionKind.NOTIFY_VLLM_RECOVERED: NotificationKind.VLLM_RECOVERED,
}
_RESTART_FAILURE = "restart"
_FAILURE_KINDS = (_RESTART_FAILURE,)
# The notifications that name the incident of their restart: it is written by the time they go out.
_AFTER_RESTART = (ActionKind.NOTIFY_RESTART_DONE, ActionKind.NOTIFY_RESTART_FAILED)
CRASH_CAUSE = "vllm_died"  # an incident's cause when vLLM died and came back without the sidecar


class Acting:
    def __init__(
        self,
        *,
        policy: Policy,
        actuator: Actuator,
        ledger_file: StateFile,
        notify: Callable[[Notification], None],
        logger: FilteringBoundLogger,
        dry_run: bool,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        boot_id: str | None = None,  # None: trust only wall times in the persisted ledger
        prober: Prober | None = None,
        incidents: IncidentRecorder | None = None,  # None: no incident folders (dry-run, --incidents-keep 0)
    ) -> None:
        self.policy = policy
        self.actuator = actuator
        self._notify = notify
        self._log = logger
        self.dry_run = dry_run
        self._clock = clock
        self._wall_clock = wall_clock
        self._store = LedgerStore(
            ledger_file,
            logger=logger,
            dry_run=dry_run,
            max_restarts_per_hour=policy.settings.max_restarts_per_hour,
            clock=clock,
            wall_clock=wall_clock,
            boot_id=boot_id,
        )
        self.ledger = self._store.load()
        self.decision: Decision | None = None
        self.recent: deque[RecentDecision] = deque(maxlen=50)  # decisions that did something, for /status
        self.actions: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()
        self._last_good: Derived | None = None
        self._last_good_s: float | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._probing = Probing(prober, logger=logger, answered=self._probe_answered)
        self._presence = Presence()
        self._incidents = incidents
        self._restart_incident: IncidentRef | None = None  # taken before the restart in progress
        self._incident_tasks: set[asyncio.Task[IncidentRef | None]] = set()
        # Awaited before each restart of the sidecar's own, after its incident (--remediate sets flags here). What
        # it returns, if anything, restarts vLLM in the adapter's place (flags written to a Deployment roll it out).
        self.before_restart: Callable[[RestartReason], Awaitable[str | None]] | None = None

    # --- ticks ----------------------------------------------------------------------------------------
    def observe(self, view: View) -> Decision:
        snapshot = view.snapshot
        self._presence.observe(snapshot)
        if snapshot.vllm.ok:
            self._last_good, self._last_good_s = view.derived, snapshot.monotonic_s
        supervision = snapshot.vllm_supervision  # asked of the restart adapter only while vLLM is gone
        observation = Observation(
            now_s=snapshot.monotonic_s,
            wall_time_s=snapshot.wall_time_s,
            poll_ok=snapshot.vllm.ok,
            vllm_healthy=snapshot.vllm_healthy,
            data_age_s=None if self._last_good_s is None else max(0.0, snapshot.monotonic_s - self._last_good_s),
            derived=self._last_good or _EMPTY,
            vllm_down=snapshot.vllm.unreachable,
            vllm_slow=snapshot.vllm_slow,
            restarter=supervision.restarter if supervision is not None else Restarter.UNKNOWN,
            restarter_detail=supervision.detail if supervision is not None else "",
        )
        return self._apply(self.policy.decide(observation, self.ledger))

    def manual(self, action: ManualAction, caller: str) -> Decision:
        self._log.warning("admin_action", action=str(action), caller=caller)
        return self._apply(
            self.policy.manual(action, self._clock(), self._wall_clock(), self.ledger, detail=f"from {caller}")
        )

    def restart_for_flags(self, text: str) -> bool:
        """Restart vLLM to apply flags changed for its next start; False when the policy refused (busy)."""
        decision = self._apply(self.policy.restart_for_flags(text, self._clock(), self._wall_clock(), self.ledger))
        return any(action.kind is ActionKind.DRAIN for action in decision.actions)

    def readiness(self) -> Readiness:
        """200 only while vLLM was seen healthy within the last polls (`Presence`) and admission is not paused.

        With --dry-run the policy's pause is only reported ("would pause"), but a vLLM the sidecar cannot see
        healthy is never reported ready: that is an observation, not an action.
        """
        presence = self._presence.verdict()
        decision = self.decision
        pause = None
        if decision is not None and decision.admission_paused:
            pause = decision.pause_reason or decision.reason
        if not presence.ready:
            restarting = decision is not None and decision.state is PolicyState.RESTARTING
            what = "not ready, vLLM restarting" if restarting else "not ready"
            also = f"; admission paused: {pause}" if pause and not self.dry_run and not restarting else ""
            return Readiness(admitting=False, reason=f"{what}, {presence.reason}{also}")
        if pause is not None and self.dry_run:
            return Readiness(admitting=True, reason=f"{presence.reason} (dry run; would pause: {pause})")
        if pause is not None:
            return Readiness(admitting=False, reason=f"paused: {pause}")
        return Readiness(admitting=True, reason=presence.reason)

    # --- carrying out ---------------------------------------------------------------------------------
    def _apply(self, decision: Decision) -> Decision:
        previous = self.decision
        self.decision = decision
        if previous is None or previous.state != decision.state:
            self._log.info(
                "policy_state", state=str(decision.state), previous=str(decision.previous_state), reason=decision.reason
            )
        self._log_blocked(previous, decision)
        recorded = [action for action in decision.actions if action.kind not in PROBE_ACTIONS]
        if recorded:  # a probe a minute on an idle server would push every decision that matters out of sight
            self.recent.append(
                {
                    "wall_time_s": decision.wall_time_s,
                    "state": str(decision.state),
                    "actions": [str(action.kind) for action in recorded],
                    # Which rule or restart reason, per action (null for a manual one): the reason's text may change
                    "causes": [None if action.cause is None else str(action.cause) for action in recorded],
                    "reason": decision.reason,
                    "dry_run": self.dry_run,
                }
            )
        for action in decision.actions:
            self._perform(action, decision)
        return decision

    def _log_blocked(self, previous: Decision | None, decision: Decision) -> None:
        """A restart that is due but refused: one line when a guard starts refusing it, one when another guard
        takes over, one when it clears; never per tick (the guard's line carries a countdown)."""
        before = (
            None if previous is None or previous.blocked_by is None else (previous.restart_reason, previous.blocked_by)
        )
        now = None if decision.blocked_by is None else (decision.restart_reason, decision.blocked_by)
        if now == before:
            return
        if now is not None:
            self._log.warning(
                "restart_blocked", restart=str(now[0]), guard=str(now[1]), detail=decision.would_restart_but
            )
        elif before is not None:
            self._log.info("restart_unblocked", restart=str(before[0]), guard=str(before[1]), now=decision.reason)

    def _perform(self, action: Action, decision: Decision) -> None:
        self.actions[str(action.kind)] += 1
        if action.kind in PROBE_ACTIONS:
            self._probing.send(action)
            return
        verb = "would " if self.dry_run else ""
        self._log.warning("action", action=str(action.kind), dry_run=self.dry_run, reason=f"{verb}{action.reason}")
        kind = _NOTIFIED.get(action.kind)
        incident = self._incident_for(action, decision)
        if kind is not None:
            if kind is NotificationKind.RESTART_FAILURE:
                self.failures[_RESTART_FAILURE] += 1
            self._notify(
                Notification(
                    kind=kind,
                    summary=action.reason,
                    reason=_notification_reason(action, decision),
                    wall_time_s=decision.wall_time_s,
                    dry_run=self.dry_run,
                    details={"state": str(decision.state)},
                    incident=incident,
                )
            )
        if action.kind is ActionKind.RESTART:
            reason = decision.restart_reason or RestartReason.MANUAL
            if self.actuator.name != "none":  # with no adapter nothing can be in flight (and the dir may be read-only)
                self._store.note_in_flight(reason, action.reason)  # before the adapter acts: a kill from here on counts
            self._restart_task = asyncio.get_running_loop().create_task(
                self._restart(reason, action.reason, str(decision.state))
            )

    def _incident_for(self, action: Action, decision: Decision) -> str | None:
        """The incident folder a notification names: its restart's, or one begun now after a crash."""
        if action.kind in _AFTER_RESTART:
            incident, self._restart_incident = self._restart_incident, None
            return incident.path if incident is not None else None
        if action.kind is not ActionKind.NOTIFY_VLLM_RECOVERED or self._incidents is None:
            return None
        # vLLM died and is back: its processes are gone, its log and the sidecar's history are not. Written
        # off the tick (bounded like any capture); the notification names the folder being written.
        ref = self._incidents.reserve(CRASH_CAUSE, decision.wall_time_s)
        capture = self._incidents.capture(
            ref, trigger=Trigger.AFTER_CRASH, state=str(decision.state), reason=action.reason, wanted=Wanted.DIED
        )
        task = asyncio.get_running_loop().create_task(capture)
        self._incident_tasks.add(task)
        task.add_done_callback(self._incident_tasks.discard)
        return ref.path

    async def _restart(self, reason: RestartReason, why: str, state: str) -> None:
        # A dead or hung engine has nothing to finish, and a stopped one cannot answer a stop: kill, then start.
        hard = reason in (RestartReason.ENGINE_DEAD, RestartReason.ENGINE_HUNG, RestartReason.FLAGS_CHANGED)
        if self._incidents is not None:  # before the restart ends what it keeps; bounded by --incident-timeout
            ref = self._incidents.reserve(str(reason), self._wall_clock())
            wanted = Wanted.DIED if reason is RestartReason.ENGINE_DEAD else Wanted.LAST
            self._restart_incident = await self._incidents.capture(
                ref, trigger=Trigger.BEFORE_RESTART, state=state, reason=why, wanted=wanted
            )
        instead = await self.before_restart(reason) if self.before_restart is not None else None
        if instead is not None:  # already under way: a second restart would replace the new vLLM again
            outcome = ActuatorOutcome(status=OutcomeStatus.DONE, detail=instead, duration_s=0.0)
        else:
            outcome = await self.actuator.restart(reason=f"{reason}: {why}", dry_run=self.dry_run, hard=hard)
        self._log.warning(
            "restart_outcome",
            adapter=self.actuator.name,
            status=str(outcome.status),
            detail=outcome.detail,
            duration_s=round(outcome.duration_s, 3),
        )
        self._account(outcome, reason)
        if outcome.status is OutcomeStatus.DONE:
            self._presence.forget_healthy()  # the process that was seen healthy is gone
        decision, ledger = self.policy.procedure_event(
            _OUTCOME_EVENTS[outcome.status], self._clock(), self._wall_clock(), self.ledger, detail=outcome.detail
        )
        if ledger is not self.ledger:
            self.ledger = ledger
            self._store.save(ledger)
        self._store.clear_in_flight()  # the outcome is known (and in the ledger when accepted)
        self._apply(decision)

    def _probe_answered(self, answer: ProbeAnswer) -> None:
        self._apply(
            self.policy.probe_event(answer.outcome, self._clock(), self._wall_clock(), self.ledger, answer.detail)
        )

    def _account(self, outcome: ActuatorOutcome, reason: RestartReason) -> None:
        # Failures and refusals are counted where the policy reports them (its restart-failed notification,
        # which also covers a restart that never became healthy), so each is counted once.
        if outcome.status is OutcomeStatus.DONE:
            self.restarts[str(reason)] += 1

    def view(self) -> ActingView:
        decision = self.decision
        readiness = self.readiness()
        last = self.ledger.last
        limit = self.policy.settings.max_restarts_per_hour
        in_window = decision.restarts_in_budget_window if decision is not None else 0
        last_probe = self._probing.last
        return ActingView(
            state=str(decision.state) if decision is not None else str(PolicyState.STARTING),
            states=tuple(str(state) for state in PolicyState),
            admission_paused=decision is not None and decision.admission_paused and not self.dry_run,
            ready=readiness.admitting,
            readiness_reason=readiness.reason,
            decision_reason=decision.reason if decision is not None else "no poll yet",
            would_restart_but=decision.would_restart_but if decision is not None else None,
            cooldown_remaining_s=decision.cooldown_remaining_s if decision is not None else None,
            restarts_in_budget_window=in_window,
            restart_budget_remaining=max(0, limit - in_window),
            last_restart_wall_time_s=last.wall_time_s if last is not None else None,
            dry_run=self.dry_run,
            actuator=self.actuator.name,
            actions=dict(self.actions),
            failures=dict(self.failures),
            restarts=dict(self.restarts),
            recent=tuple(self.recent),
            action_kinds=tuple(str(kind) for kind in ActionKind),
            failure_kinds=_FAILURE_KINDS,
            restart_reasons=tuple(str(reason) for reason in RestartReason),
            probes=dict(self._probing.outcomes),
            probe_outcomes=tuple(str(outcome) for outcome in ProbeOutcome),
            last_probe=None if last_probe is None else f"{last_probe.outcome}: {last_probe.detail}",
            last_probe_duration_s=None if last_probe is None else last_probe.duration_s,
            last_incident=self._incidents.last if self._incidents is not None else None,
            incidents=dict(self._incidents.kept) if self._incidents is not None else {},
            incident_triggers=tuple(str(trigger) for trigger in Trigger) if self._incidents is not None else (),
            incident_parts_missing=dict(self._incidents.missing) if self._incidents is not None else {},
            incident_kinds=tuple(str(kind) for kind in Kind) if self._incidents is not None else (),
        )

    @property
    def restart_in_flight(self) -> bool:
        return self._restart_task is not None and not self._restart_task.done()

    async def close(self) -> None:
        for incident in list(self._incident_tasks):
            incident.cancel()
        await asyncio.gather(*self._incident_tasks, return_exceptions=True)
        await self._probing.close()
        task = self._restart_task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                self._log.warning("restart_abandoned", detail="the sidecar stopped while the adapter was working")
        await self.actuator.close()


def _notification_reason(action: Action, decision: Decision) -> str:
    """The machine-friendly cause: the rule or restart reason, else what happened."""
    if action.kind is ActionKind.NOTIFY_VLLM_RECOVERED:
        return str(NotificationKind.VLLM_RECOVERED)
    return str(action.cause or decision.restart_reason or action.kind)


class AdminBridge:
    """The admin API's actions, each a manual override of the policy, answered with its reason."""

    def __init__(self, acting: Acting) -> None:
        self._acting = acting

    def pause(self, caller: str) -> str:
        return self._acting.manual(ManualAction.PAUSE, caller).reason

    def resume(self, caller: str) -> str:
        return self._acting.manual(ManualAction.RESUME, caller).reason

    def restart(self, caller: str) -> str:
        return self._acting.manual(ManualAction.RESTART, caller).reason
