"""Logs what changed between ticks (a source failing or recovering, a problem appearing or clearing).

One line per change, never one per tick: a vLLM that stays down for an hour logs once.
"""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from sidecar.derive.tick import HEALTH_FAILING
from sidecar.model.derived import Derived
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult


class TransitionLog:
    def __init__(self, logger: FilteringBoundLogger) -> None:
        self._log = logger
        self._source_errors: dict[str, str | None] = {}
        self._problems: set[str] = set()
        self._healthy: bool | None = None

    def observe(self, snapshot: Snapshot, derived: Derived) -> None:
        sources: list[SourceResult[object]] = [snapshot.vllm]
        if snapshot.gpu is not None:
            sources.append(snapshot.gpu)
        for result in sources:
            self._source(result)
        if snapshot.vllm_healthy is not None and snapshot.vllm_healthy != self._healthy:
            if snapshot.vllm_healthy:
                self._log.info("vllm_health_ok")
            elif self._healthy is not None or not snapshot.vllm.ok:
                self._log.warning("vllm_health_failing")
            self._healthy = snapshot.vllm_healthy
        source_errors = {result.error for result in sources if result.error is not None}
        problems = set(derived.problems) - source_errors - {HEALTH_FAILING}
        for problem in sorted(problems - self._problems):
            self._log.warning("problem_found", problem=problem)
        for problem in sorted(self._problems - problems):
            self._log.info("problem_resolved", problem=problem)
        self._problems = problems

    def _source(self, result: SourceResult[object]) -> None:
        known = result.source in self._source_errors
        previous = self._source_errors.get(result.source)
        if result.error is not None and result.error != previous:
            self._log.error("source_failed", source=result.source, error=result.error)
        elif result.error is None and (previous is not None or not known):
            self._log.info("source_ok", source=result.source, duration_s=round(result.duration_s, 4))
        self._source_errors[result.source] = result.error
