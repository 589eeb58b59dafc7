"""Opt-in remediation (--remediate): after a crash whose cause the doctor determined, set the flag it computed
for vLLM's next start, then follow the change until it is confirmed or reverted. Async I/O.

Two moments read vLLM's log with the doctor (as the restart notifications do, `cause_reading.explain`):
- before a restart of the sidecar's own (`before_restart`, awaited by acting after the incident is kept): the
  start that died or is about to be restarted. A change made then is applied by that very restart;
- while vLLM does not serve (`observe`, every tick): once it has not been healthy for `check_after_s`, its
  newest start is read every `check_every_s`; a start that crashed (a refusal, an OOM, a dead engine) is
  what a change is made for, and a change then asks acting for a restart that applies it (`restart`).
The decision itself is pure (`sidecar.policy.remediation`). A change waits to prove itself: vLLM healthy within
the start timeout and through `window_s`, without the same cause back; else it is reverted, the flag is held
and the notification says a person must decide. With --dry-run the change is computed, logged and notified as
"would", and nothing is written or restarted.

Where writing the flags restarts vLLM by itself (`FlagsTarget.restarts_on_change`: on Kubernetes a change of the
Deployment's args rolls its pods out), no restart is asked for, and before a restart of the sidecar's own the
write takes that restart's place (`before_restart` says so to acting): a second restart would replace the new
pod again. The sidecar that wrote such a change leaves it to the new pod's sidecar to judge (its own vLLM never
runs with it); that one loads the record with the change pending and follows it.

A log that cannot be read, or a record that cannot be written, changes nothing and is logged once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogSource, Wanted
from sidecar.actuators.remediation_record import RecordError
from sidecar.model.acting import RemediationView
from sidecar.model.cause import CrashCause
from sidecar.model.remediation import Allowance, Step, StepState, shown
from sidecar.notify.message import Notification, NotificationKind
from sidecar.policy.decision import RestartReason
from sidecar.policy.remediation import Refusal, Watch, flags_in_effect, judge, judge_crash, pending, propose, settle
from sidecar.shell.crash_cause import read_cause
from sidecar.shell.remediation_store import FlagsTarget

CHECK_AFTER_S = 30.0  # not healthy this long before vLLM's log is read for a failed start
CHECK_EVERY_S = 30.0  # and then at most this often, while it stays so
READ_TIMEOUT_S = 5.0
VIEW_STEPS = 10  # the newest steps /status shows (`vllm-sidecar remediations list` shows them all)


@dataclass(frozen=True, slots=True, kw_only=True)
class RemediationSettings:
    allowances: tuple[Allowance, ...]
    max_per_day: int
    window_s: float
    start_timeout_s: float
    check_after_s: float = CHECK_AFTER_S
    check_every_s: float = CHECK_EVERY_S
    read_timeout_s: float = READ_TIMEOUT_S


class Remediator:
    def __init__(
        self,
        settings: RemediationSettings,
        *,
        target: FlagsTarget,
        source: LogSource | None,
        notify: Callable[[Notification], None],
        logger: FilteringBoundLogger,
        dry_run: bool,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.target = target
        self._source = source
        self._notify = notify
        self._log = logger
        self.dry_run = dry_run
        self._clock = clock
        self._wall_clock = wall_clock
        self.steps: list[Step] = []
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (flag, outcome) -> count, for the metric
        self.last_refusal: str | None = None
        self.problem: str | None = None  # why the record or the log cannot be used, logged once
        self._watch: Watch | None = None
        self._unhealthy_since_s: float | None = None
        self._next_check_s = 0.0
        self._check: asyncio.Task[None] | None = None
        self._settling: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one reading and deciding at a time
        self._restart_owed: str | None = None  # a restart to ask for again: acting refused it (busy)
        self._handed_over: Step | None = None  # written here, applied by a rollout: the new pod's sidecar judges it
        # Set by the daemon: ask acting for a restart that applies the flags (True when it began), and whether a
        # restart is with the adapter now (no log is read then: it shows a process being replaced).
        self.restart: Callable[[str], bool] = lambda _text: False
        self.busy: Callable[[], bool] = lambda: False

    # --- start -------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Read the record (RecordError when it cannot be used); a change still proving itself is watched again
        from now (a sidecar restarted, or, on Kubernetes, the new pod's sidecar after the rollout)."""
        self.steps = await self.target.read()
        if pending(self.steps) is not None:
            self._watch = Watch(set_s=self._clock(), healthy_since_s=None)

    @property
    def flags(self) -> dict[str, float]:
        return flags_in_effect(self.steps)

    @property
    def pending(self) -> Step | None:
        return pending(self.steps)

    # --- the two moments ---------------------------------------------------------------------------
    async def before_restart(self, reason: RestartReason) -> str | None:
        """Before a restart of the sidecar's own: the cause of the start it ends. Bounded by the read's timeout.

        Returns what restarts vLLM in that restart's place when a change was written to a target that restarts
        vLLM by itself (the Deployment's rollout), for acting to record instead of restarting; else None."""
        if reason is RestartReason.FLAGS_CHANGED:
            return None  # this restart applies what was just decided
        wanted = Wanted.DIED if reason is RestartReason.ENGINE_DEAD else Wanted.LAST
        async with self._lock:
            cause = await self._read(wanted)
            written = cause is not None and await self._consider(cause, restart=False)
        if written and self.target.restarts_on_change:
            return f"vLLM's flags changed in {self.target.where}: that write restarts vLLM with them"
        return None

    def observe(self, *, healthy: bool, now_s: float) -> None:
        """Each tick: follow a change that proves itself; read the log of a vLLM that does not serve."""
        if healthy:
            self._unhealthy_since_s = None
        elif self._unhealthy_since_s is None:
            self._unhealthy_since_s = now_s
        self._follow(healthy, now_s)
        if self._restart_owed is not None and self.restart(self._restart_owed):
            self._restart_owed = None
        if healthy or self._unhealthy_since_s is None or self.busy():
            return
        if now_s - self._unhealthy_since_s < self.settings.check_after_s or now_s < self._next_check_s:
            return
        if self._check is not None and not self._check.done():
            return
        self._next_check_s = now_s + self.settings.check_every_s
        self._check = asyncio.get_running_loop().create_task(self._check_start(), name="remediation check")

    async def _check_start(self) -> None:
        async with self._lock:
            cause = await self._read(Wanted.LAST)
            if cause is not None and cause.crashed:
                await self._consider(cause, restart=True)

    # --- following a change ------------------------------------------------------------------------
    def _follow(self, healthy: bool, now_s: float) -> None:
        step = self.pending
        if step is None or step == self._handed_over:
            self._watch = None
            return
        watch = self._watch or Watch(set_s=now_s, healthy_since_s=None)
        if healthy and watch.healthy_since_s is None:
            watch = Watch(set_s=watch.set_s, healthy_since_s=now_s)
        elif not healthy and watch.healthy_since_s is not None:
            watch = Watch(set_s=now_s, healthy_since_s=None)  # down again: the start timeout runs anew
        self._watch = watch
        verdict = judge(
            step,
            watch,
            now_s=now_s,
            start_timeout_s=self.settings.start_timeout_s,
            window_s=self.settings.window_s,
        )
        if verdict is not None and (self._settling is None or self._settling.done()):
            self._settling = asyncio.get_running_loop().create_task(
                self._settle_alone(step, verdict, restart=not healthy), name="remediation settle"
            )

    async def _settle_alone(self, step: Step, verdict: str, *, restart: bool) -> None:
        async with self._lock:
            await self._settle(step, verdict, restart=restart)

    async def _settle(self, step: Step, verdict: str, *, restart: bool) -> bool:
        """Settle `step`; True when that was written."""
        settled = settle(step, verdict, self._wall_clock())

        def edit(steps: list[Step]) -> list[Step]:
            # Only the step as this sidecar knows it: a person may have reverted it meanwhile (the command line).
            return [settled if s == step else s for s in steps]

        if not await self._write(edit) or settled not in self.steps:
            self._watch = None
            return False
        self._watch = None
        outcome = str(settled.state)
        self.outcomes[(step.flag, outcome)] += 1
        reverted = settled.state is StepState.REVERTED
        log = self._log.warning if reverted else self._log.info
        log("remediation_" + outcome, flag=step.flag, change=step.diff(), outcome=verdict)
        now_value = self.flags.get(step.flag)
        after = f"; vLLM's next start gets {self._flag_words(step.flag, now_value)}" if reverted else ""
        self._tell(f"{step.diff()} {verdict}{after}", reason=f"remediation_{outcome}", step=settled)
        if reverted and restart and not self.target.restarts_on_change:
            self._ask_restart(f"{step.flag} reverted: {verdict}")
        return True

    # --- deciding ----------------------------------------------------------------------------------
    async def _consider(self, cause: CrashCause, *, restart: bool) -> bool:
        """Change, revert or refuse for `cause`; True when a change or a revert was written."""
        try:
            self.steps = await self._read_steps()
        except RecordError:
            return False
        step = self.pending
        if step is not None:
            if step == self._handed_over:
                return False  # this vLLM never ran with it: the rollout's new pod judges it
            verdict = judge_crash(step, cause)
            return verdict is not None and await self._settle(step, verdict, restart=restart)
        proposal = propose(
            cause,
            allowances=self.settings.allowances,
            steps=self.steps,
            now_wall_s=self._wall_clock(),
            max_per_day=self.settings.max_per_day,
        )
        if isinstance(proposal, Refusal):
            self._refuse(proposal, cause)
            return False
        return proposal is not None and await self._change(proposal, restart=restart)

    async def _change(self, proposal: Step, *, restart: bool) -> bool:
        """Write the change (with --dry-run only say it would be made); True when it was written."""
        if self.dry_run:
            self.outcomes[(proposal.flag, "would_apply")] += 1
            self._log.warning("remediation_would_apply", change=proposal.diff(), cause=proposal.cause)
            self._tell(
                f"set {proposal.diff()} ({proposal.cause}: {proposal.why})",
                reason="remediation_would_apply",
                step=proposal,
            )
            return False
        if not await self._write(lambda steps: [*steps, proposal]):
            return False
        self.last_refusal = None
        self._watch = Watch(set_s=self._clock(), healthy_since_s=None)
        self.outcomes[(proposal.flag, "applied")] += 1
        self._log.warning("remediation_applied", change=proposal.diff(), cause=proposal.cause, why=proposal.why)
        if self.target.restarts_on_change:
            self._handed_over = proposal
            how = "writing it restarts vLLM with it"
        else:
            how = "restarting vLLM with it" if restart else "the restart under way applies it"
        self._tell(
            f"set {proposal.diff()} for vLLM's next start ({proposal.cause}: {proposal.why}); {how}",
            reason="remediation_applied",
            step=proposal,
        )
        if restart and not self.target.restarts_on_change:
            self._ask_restart(f"{proposal.diff()} for {proposal.cause}")
        return True

    def _refuse(self, refusal: Refusal, cause: CrashCause) -> None:
        if refusal.why == self.last_refusal:
            return  # the same crash read again, refused for the same reason: said once
        self.last_refusal = refusal.why
        flag = refusal.flag or "none"
        self.outcomes[(flag, "refused")] += 1
        self._log.warning("remediation_refused", flag=flag, cause=cause.cause, why=refusal.why)
        self._tell(f"no change to vLLM's flags for {cause.cause}: {refusal.why}", reason="remediation_refused")

    def _ask_restart(self, text: str) -> None:
        if not self.restart(text):
            self._restart_owed = text

    # --- I/O ---------------------------------------------------------------------------------------
    async def _read(self, wanted: Wanted) -> CrashCause | None:
        source = self._source
        if source is None:
            self._problem("no vLLM log to read: --remediate needs one (--vllm-log FILE, the journal, the pod's log)")
            return None
        now = self._wall_clock()
        cause = await read_cause(
            source, wanted, until_wall_s=now, timeout_s=self.settings.read_timeout_s, wall_time_s=now
        )
        if isinstance(cause, str):
            self._problem(cause)
            return None
        return cause

    async def _read_steps(self) -> list[Step]:
        try:
            steps = await self.target.read()
        except RecordError as error:
            self._problem(f"the remediation record cannot be used, nothing is changed: {error}")
            raise
        self.problem = None
        return steps

    async def _write(self, edit: Callable[[list[Step]], list[Step]]) -> bool:
        try:
            self.steps = await self.target.update(edit)
        except RecordError as error:
            self._problem(f"nothing changed: {error}")
            return False
        return True

    def _problem(self, why: str) -> None:
        if why != self.problem:
            self.problem = why
            self._log.warning("remediation_problem", reason=why)

    def _tell(self, summary: str, *, reason: str, step: Step | None = None) -> None:
        details = {"flags_file": self.target.where}
        if step is not None:
            details.update({"flag": step.flag, "change": step.diff(), "why": step.why, "cause": step.cause})
        self._notify(
            Notification(
                kind=NotificationKind.REMEDIATION,
                summary=summary,
                reason=reason,
                wall_time_s=self._wall_clock(),
                dry_run=self.dry_run,
                details=details,
            )
        )

    @staticmethod
    def _flag_words(flag: str, value: float | None) -> str:
        return f"{flag} {shown(flag, value)}" if value is not None else f"no {flag} of the sidecar's"

    def view(self) -> RemediationView:
        return RemediationView(
            allowed=self.settings.allowances,
            flags_file=self.target.where,
            flags=self.flags,
            steps=tuple(self.steps[-VIEW_STEPS:]),
            outcomes=dict(self.outcomes),
            last_refusal=self.last_refusal,
            problem=self.problem,
        )

    async def close(self) -> None:
        tasks = [task for task in (self._check, self._settling) if task is not None and not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
