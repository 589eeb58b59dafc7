"""The restart ledger: which restarts happened, when and why. A pure value; the shell persists it as JSON.

Why wall time: the ledger must survive the sidecar's own restart (otherwise a crash-looping sidecar would
get a fresh budget each time), and a monotonic clock starts over with the process and the host. So records
carry Unix time, the one clock that outlives both.

Why that is safe against the wall clock jumping backwards: a record that lies in the future is kept and
counts (it did happen, we just cannot say how long ago): `count_since` counts it, `budget_wait_s` waits for
it. The policy goes one step further (see `Policy`): it reads a record's age from the wall clock once, when it
first sees it, clamped at 0, and ages it by the monotonic clock from then on, so a jump in either direction
after that changes nothing, and a record in the future counts as "just happened".

Across the sidecar's own restart the wall clock is all a new process has, unless the record also carries the
monotonic time it was made at (`monotonic_s`): that clock runs from the host's boot, the same for every
process, so on the same boot it ages a record exactly even when the wall clock jumped while no sidecar ran.
The shell knows which boot wrote the file and asks `from_dict` to keep `monotonic_s` only for this one.
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
    monotonic_s: float | None = None  # the monotonic clock then, on this boot; None when unknown or another boot


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
            "restarts": [_record_dict(r) for r in self.records],
        }

    @classmethod
    def from_dict(cls, document: object, *, same_boot: bool = False) -> RestartLedger:
        """Read what `to_dict` wrote; `RestartLedgerError` naming the problem on anything else. `monotonic_s` is
        kept only with `same_boot` (the caller knows the file was written since this host booted)."""
        if not isinstance(document, dict):
            raise RestartLedgerError(f"expected a JSON object, got {type(document).__name__}")
        if document.get("version") != LEDGER_FORMAT_VERSION:
            raise RestartLedgerError(f"unsupported ledger version {document.get('version')!r}")
        restarts = document.get("restarts")
        if not isinstance(restarts, list):
            raise RestartLedgerError("'restarts' must be a list")
        records = tuple(_read_record(item, index, same_boot=same_boot) for index, item in enumerate(restarts))
        return cls(records=records[-MAX_RECORDS:])


def _record_dict(record: RestartRecord) -> dict[str, object]:
    found: dict[str, object] = {
        "wall_time_s": record.wall_time_s,
        "reason": record.reason.value,
        "detail": record.detail,
    }
    if record.monotonic_s is not None:
        found["monotonic_s"] = record.monotonic_s
    return found


def _read_record(item: object, index: int, *, same_boot: bool) -> RestartRecord:
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
    monotonic = item.get("monotonic_s")
    kept: float | None = None
    # Anything but a finite number is dropped, not refused: the wall time alone still makes a usable record.
    if (
        same_boot
        and isinstance(monotonic, int | float)
        and not isinstance(monotonic, bool)
        and math.isfinite(monotonic)
    ):
        kept = float(monotonic)
    return RestartRecord(wall_time_s=float(wall), reason=RestartReason(reason), detail=detail, monotonic_s=kept)
