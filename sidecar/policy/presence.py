"""Whether vLLM is there to take traffic: seen healthy within the last few polls, and if not, why. Pure.

/readyz answers 200 only while this says so (and admission is not paused): a load balancer or a systemd host
in front of the sidecar must never send traffic to a server the sidecar cannot see healthy. The evidence is a
/health 200; for a server without /health (404) a readable exposition with vllm: families stands in for it.
One or two polls without that evidence are forgiven (a slow answer, a GC pause); by the third, readiness is
withdrawn with one line saying why:

- unreachable: nothing answers at the URL, and vLLM has not been seen healthy since the sidecar started
  (vLLM listens only once its model is loaded, so a vLLM still loading looks exactly like this);
- not vLLM: the server answers, but has no /health and no vllm: metrics;
- not healthy yet: /health answers, but not 200, and vLLM was never healthy (still loading, or failing at start);
- gone: vLLM was healthy, and now nothing answers;
- not healthy: vLLM was healthy, and /health now answers something else (503 when its engine died).

A vLLM that is healthy but whose metrics cannot be read (`--disable-log-stats`, a /metrics error) stays ready,
with the problem in the reason: a sidecar that cannot watch must not take a healthy server out of rotation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sidecar.model.health import HealthAnswer
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import MetricSchema
from sidecar.policy.rules import seconds

READY_POLLS = 3  # seen healthy within this many polls: the contract's "within the last 3 polls"
READY = "ready: admitting traffic"


@dataclass(frozen=True, slots=True, kw_only=True)
class PresenceVerdict:
    ready: bool
    reason: str  # one line; starts with "ready" when ready


@dataclass(frozen=True, slots=True, kw_only=True)
class _Poll:
    now_s: float
    healthy: bool  # the evidence: /health 200, or vllm: metrics from a server without /health
    answer: HealthAnswer | None  # None: /health was not asked (older recordings)
    health_detail: str
    metrics_problem: str | None  # why the sidecar cannot watch this vLLM, when it cannot


class Presence:
    def __init__(self, polls: int = READY_POLLS) -> None:
        self._recent: deque[_Poll] = deque(maxlen=polls)
        self._healthy_s: float | None = None  # the last poll on which vLLM was seen healthy

    def observe(self, snapshot: Snapshot) -> None:
        poll = _poll(snapshot)
        self._recent.append(poll)
        if poll.healthy:
            self._healthy_s = poll.now_s

    def forget_healthy(self) -> None:
        """After a restart the sidecar asked for: the old process's health says nothing about the new one."""
        self._recent.clear()
        self._healthy_s = None

    def verdict(self) -> PresenceVerdict:
        if not self._recent:
            return PresenceVerdict(ready=False, reason="vLLM not polled yet")
        latest = self._recent[-1]
        if latest.healthy:
            if latest.metrics_problem is not None:
                return PresenceVerdict(ready=True, reason=f"{READY}; but {latest.metrics_problem}")
            return PresenceVerdict(ready=True, reason=READY)
        polls_ago = next((i for i, poll in enumerate(reversed(self._recent)) if poll.healthy), None)
        if polls_ago is not None:
            ago = "1 poll" if polls_ago == 1 else f"{polls_ago} polls"
            last = latest.health_detail
            return PresenceVerdict(ready=True, reason=f"{READY}; vLLM seen healthy {ago} ago, last poll: {last}")
        return PresenceVerdict(ready=False, reason=self._why_not(latest))

    def _why_not(self, latest: _Poll) -> str:
        """'<what>: <the last answer>', e.g. 'gone (was healthy 12 s ago): vLLM unreachable at ...: connection
        refused'."""
        answer = latest.answer
        was = None if self._healthy_s is None else f"was healthy {seconds(latest.now_s - self._healthy_s)} ago"
        if answer is HealthAnswer.NO_ENDPOINT:
            what = f"not vLLM ({latest.metrics_problem or 'its /metrics has no vllm: family'})"
        elif answer is HealthAnswer.FAILING:
            what = f"not healthy ({was})" if was is not None else "not healthy yet (still loading, or failing at start)"
        elif was is not None:
            what = f"gone ({was})"
        else:
            what = "unreachable (not started, or still loading: vLLM listens once its model is loaded)"
        return f"{what}: {latest.health_detail}"


def _poll(snapshot: Snapshot) -> _Poll:
    reading = snapshot.vllm.value if snapshot.vllm.ok else None
    is_vllm = reading is not None and reading.schema is not MetricSchema.NO_VLLM_METRICS
    if reading is None:
        metrics_problem: str | None = f"the sidecar cannot read its metrics: {snapshot.vllm.error}"
    elif not is_vllm:
        metrics_problem = "its /metrics has no vllm: family (--disable-log-stats?): the sidecar cannot watch it"
    else:
        metrics_problem = None
    health = snapshot.vllm_health
    if health is not None:
        healthy = health.ok or (health.answer is HealthAnswer.NO_ENDPOINT and is_vllm)
        return _Poll(
            now_s=snapshot.monotonic_s,
            healthy=healthy,
            answer=health.answer,
            health_detail=health.detail,
            metrics_problem=metrics_problem,
        )
    # Not asked: the verdict alone (a recording), or, without one, the metrics as for a server without /health.
    healthy = snapshot.vllm_healthy if snapshot.vllm_healthy is not None else is_vllm
    detail = "vLLM /health not 200" if snapshot.vllm_healthy is False else (snapshot.vllm.error or "no /health answer")
    answer = HealthAnswer.FAILING if snapshot.vllm_healthy is False else None
    if snapshot.vllm.unreachable:
        answer = HealthAnswer.REFUSED
    return _Poll(
        now_s=snapshot.monotonic_s,
        healthy=healthy,
        answer=answer,
        health_detail=detail,
        metrics_problem=metrics_problem,
    )
