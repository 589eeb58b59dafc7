"""The outcome of reading one source: a value or an error, always with how long it took. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)  # read-only fields: a result of a subtype is a result of its base


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceResult(Generic[T_co]):
    source: str
    duration_s: float
    value: T_co | None = None
    error: str | None = None
    # Nothing listens at the source's address (connection refused): its process is not running, as opposed
    # to running and failing. A supervisor restarting vLLM looks like this for the whole of its load time.
    unreachable: bool = False
    # Something answers at the address, but not as the server the source reads (vLLM: /metrics is 404, or not an
    # exposition): a wrong port or URL, another program there. Not `unreachable`: it is said as what it is.
    wrong_server: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.value is not None
