"""Sends the engine probes the policy asks for and hands each answer back to it; logs only what is new.

Does I/O through the prober it is given (sidecar.sources.probe). A probe runs as a task, off the tick: an engine
that does not answer takes the probe's whole timeout. Probes are sent in dry-run too: they read, they do not act
on vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from sidecar.policy.decision import Action, ActionKind
from sidecar.policy.probe import ProbeOutcome
from sidecar.sources.probe import ProbeAnswer

_NO_PROBER = ProbeAnswer(outcome=ProbeOutcome.INCONCLUSIVE, detail="no probe sender is configured", duration_s=0.0)
PROBE_ACTIONS = (ActionKind.PROBE_ENGINE, ActionKind.WARM_UP_ENGINE)


class Prober(Protocol):
    """Sends the engine probe (sidecar.sources.probe) and says what came back; never raises."""

    async def probe(self, *, warm_up: bool = False) -> ProbeAnswer: ...


class Probing:
    """One probe in flight at a time (the policy asks for the next only after the last one's answer)."""

    def __init__(
        self, prober: Prober | None, *, logger: FilteringBoundLogger, answered: Callable[[ProbeAnswer], None]
    ) -> None:
        self._prober = prober
        self._log = logger
        self._answered = answered  # the policy's probe event, applied like any decision
        self._task: asyncio.Task[None] | None = None
        self._sent_for: tuple[ActionKind, object] | None = None  # what the last probe was sent for
        self.outcomes: Counter[str] = Counter()
        self.last: ProbeAnswer | None = None

    def send(self, action: Action) -> None:
        # Logged at info when it says something new: the first probe of its kind (a stall's, a warm-up, the idle
        # routine), and any answer unlike the last; a probe repeated for the same reason with the same answer
        # (the idle routine of a working engine, every --probe-after) at debug, or it would drown every
        # decision that matters.
        sent_for = (action.kind, action.cause)
        repeated = sent_for == self._sent_for and self.last is not None
        self._sent_for = sent_for
        warm_up = action.kind is ActionKind.WARM_UP_ENGINE
        log = self._log.debug if repeated else self._log.info
        log("probe_sent", kind="warm_up" if warm_up else "probe", reason=action.reason)
        self._task = asyncio.get_running_loop().create_task(self._probe(warm_up=warm_up, repeated=repeated))

    async def _probe(self, *, warm_up: bool, repeated: bool) -> None:
        answer = await self._prober.probe(warm_up=warm_up) if self._prober is not None else _NO_PROBER
        self.outcomes[str(answer.outcome)] += 1
        previous, self.last = self.last, answer
        same = (
            repeated
            and previous is not None
            and previous.outcome is answer.outcome
            and (answer.outcome is ProbeOutcome.ANSWERED or previous.detail == answer.detail)
        )
        loud = self._log.info if answer.outcome is ProbeOutcome.ANSWERED else self._log.warning
        (self._log.debug if same else loud)(
            "probe_" + str(answer.outcome), detail=answer.detail, duration_s=round(answer.duration_s, 3)
        )
        self._answered(answer)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
