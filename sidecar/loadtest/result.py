"""The outcome of one request of a load test, success or one kind of failure. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.loadtest.spec import PlannedRequest
from sidecar.model.text import plural


class FailureKind(StrEnum):
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    TIMEOUT = "timeout"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"  # dropped before or during the answer
    PROTOCOL = "protocol"  # an answer that is not an OpenAI completion
    DROPPED_BY_CLIENT = "dropped_by_client"  # open loop, more than --max-in-flight already running
    NOT_READY = "not_ready"  # --readiness-url answered non-200: a router would not have sent it (its 503)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestResult:
    """One request of the run; times are seconds, `started_s` counted from the start of the run."""

    index: int
    started_s: float
    duration_s: float  # until the answer was complete or the request failed; 0 when never sent
    requested_prompt_tokens: int
    requested_output_tokens: int
    failure: FailureKind | None = None  # None: it succeeded
    status_code: int | None = None
    error: str | None = None  # one line, for failures
    ttft_s: float | None = None  # successes over streaming only
    prompt_tokens: int | None = None  # the server's usage, when it reported one
    completion_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def finished_s(self) -> float:
        return self.started_s + self.duration_s


def _unsent(planned: PlannedRequest, at_s: float, failure: FailureKind, error: str) -> RequestResult:
    """A planned request the client never sent, and why."""
    return RequestResult(
        index=planned.index,
        started_s=at_s,
        duration_s=0.0,
        requested_prompt_tokens=planned.prompt_words,
        requested_output_tokens=planned.max_tokens,
        failure=failure,
        error=error,
    )


def dropped(planned: PlannedRequest, at_s: float, limit: int) -> RequestResult:
    return _unsent(
        planned, at_s, FailureKind.DROPPED_BY_CLIENT, f"{plural(limit, 'request')} already in flight (--max-in-flight)"
    )


def not_ready(planned: PlannedRequest, at_s: float, url: str) -> RequestResult:
    """An arrival while the readiness gate was closed: what a client behind a router or Service would get."""
    return _unsent(planned, at_s, FailureKind.NOT_READY, f"not ready: {url} did not answer 200")
