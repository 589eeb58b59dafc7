"""The restart ledger: which restarts happened, when and why. A pure value; the shell persists it as JSON.

Why wall time: the ledger must survive the sidecar's own restart (otherwise a crash-looping sidecar would
get a fresh budget each time), and a monotonic clock starts over with the process and the host. So records
carry Unix time, the one clock that outlives both.

Why that is safe against the wall clock jumping backwards: a record that lies in the future is kept and
counts (it did happen, we just cannot say how long ago): `count_since` counts it, `budget_wait_s` waits for
it. The policy goes one step further (see `Policy`): it reads a record's age from the wall clock once, when it
first sees it, clamped at 0, and ages it by the monotonic clock from then on, so a jump in either direction
after that changes nothing, and a record in the future counts as "just happened".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.policy.decision import RestartReason

LEDGER_FORMAT_VERSION = 1
MAX_RECORDS = 64  # far more than the budget and cooldown series ever look at; keeps the file small


class RestartLedgerError(ValueError):
    """The persisted ledger could not be read back; the message says what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartRecord:
    wall_time_s: float  # Unix seconds when the restart adapter accepted the restart
    reason: RestartReason
    detail: str = ""  # one line: the rule's numbers, or the adapter's answer


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartLedger:
    records: tuple[RestartRecord, ...] = ()  # in the order they happened (not sorted: the clock may jump)

    @property
    def last(self) -> RestartRecord | None:
        return self.records[-1] if self.records else None

    def record(self, record: RestartRecord) -> RestartLedger:
        """A new ledger with `record` appended, keeping the newest `MAX_RECORDS`."""
        return RestartLedger(records=(*self.records, record)[-MAX_RECORDS:])

    def count_since(self, since_wall_s: float) -> int:
        """Restarts after `since_wall_s`; a record in the future counts."""
        return sum(1 for record in self.records if record.wall_time_s > since_wall_s)

    def consecutive(self, reset_after_s: float) -> int:
        """How many restarts the latest one ends, each less than `reset_after_s` after the one before it.

        A gap that is negative (the clock went back between two restarts) is a short gap: the series goes on.
        """
        if not self.records:
            return 0
        count = 1
        for earlier, later in zip(self.records[-2::-1], self.records[:0:-1], strict=True):
            if later.wall_time_s - earlier.wall_time_s >= reset_after_s:
                break
            count += 1
        return count

    def budget_wait_s(self, now_wall_s: float, window_s: float, limit: int) -> float:
        """Seconds until fewer than `limit` restarts lie in the last `window_s`; 0 when that is already so."""
        if limit <= 0:
            return math.inf
        in_window = sorted(r.wall_time_s for r in self.records if r.wall_time_s > now_wall_s - window_s)
        if len(in_window) < limit:
            return 0.0
        # The restart whose ageing out brings the count down to limit - 1.
        leaving = in_window[len(in_window) - limit]
        return max(0.0, leaving + window_s - now_wall_s)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready document, the shape `from_dict` reads."""
        return {
            "version": LEDGER_FORMAT_VERSION,
            "restarts": [
                {"wall_time_s": r.wall_time_s, "reason": r.reason.value, "detail": r.detail} for r in self.records
            ],
        }

    @classmethod
    def from_dict(cls, document: object) -> RestartLedger:
        """Read what `to_dict` wrote; `RestartLedgerError` naming the problem on anything else."""
        if not isinstance(document, dict):
            raise RestartLedgerError(f"expected a JSON object, got {type(document).__name__}")
        if document.get("version") != LEDGER_FORMAT_VERSION:
            raise RestartLedgerError(f"unsupported ledger version {document.get('version')!r}")
        restarts = document.get("restarts")
        if not isinstance(restarts, list):
            raise RestartLedgerError("'restarts' must be a list")
        return cls(records=tuple(_read_record(item, index) for index, item in enumerate(restarts))[-MAX_RECORDS:])


def _read_record(item: object, index: int) -> RestartRecord:
    if not isinstance(item, dict):
        raise RestartLedgerError(f"restarts[{index}] must be an object")
    wall = item.get("wall_time_s")
    # bool is an int subclass; a true/false here is a corrupt file, not a time.
    if isinstance(wall, bool) or not isinstance(wall, int | float) or not math.isfinite(wall):
        raise RestartLedgerError(f"restarts[{index}].wall_time_s must be a finite number, got {wall!r}")
    reason = item.get("reason")
    if not isinstance(reason, str) or reason not in {known.value for known in RestartReason}:
        raise RestartLedgerError(f"restarts[{index}].reason {reason!r} is not one of {', '.join(RestartReason)}")
    detail = item.get("detail", "")
    if not isinstance(detail, str):
        raise RestartLedgerError(f"restarts[{index}].detail must be a string")
    return RestartRecord(wall_time_s=float(wall), reason=RestartReason(reason), detail=detail)
