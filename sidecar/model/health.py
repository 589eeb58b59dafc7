"""What vLLM's /health said on one poll, beyond yes or no. Pure data.

Readiness tells a load balancer why vLLM is not taking traffic (nothing listens, not vLLM at all, not healthy
yet, gone), so the answer is kept as one of a few kinds and the line that describes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HealthAnswer(StrEnum):
    OK = "ok"  # 200
    FAILING = "failing"  # an HTTP answer other than 200 and 404 (vLLM: 503 on EngineDeadError, 500 before 0.11)
    NO_ENDPOINT = "no_endpoint"  # 404: this server has no /health (not vLLM, or a proxy in front of it)
    REFUSED = "refused"  # connection refused: nothing listens at the address
    NO_ANSWER = "no_answer"  # no answer in time, a reset, a name that does not resolve


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthCheck:
    answer: HealthAnswer
    detail: str  # one line: what was asked and what came back

    @property
    def ok(self) -> bool:
        return self.answer is HealthAnswer.OK


HEALTH_STANDS = HealthCheck(answer=HealthAnswer.OK, detail="a recent /health 200 stands")
