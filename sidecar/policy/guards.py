"""The restart guards that read the ledger: the hourly budget and the exponential cooldown. Pure, no I/O.

`RecordClock` is the policy's defence against wall-clock jumps: it reads each ledger record's age from the
wall clock once, the first time it sees the record (clamped at 0: a record in the future "just happened"),
and from then on ages it by the monotonic clock. A record that carries its monotonic time from this boot
(written by an earlier sidecar process since the host booted) is aged by that from the start instead. `aged`
rewrites the ledger against the current wall clock with those ages, so `RestartLedger`'s own arithmetic works
on times that cannot jump.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecar.model.text import plural
from sidecar.policy.ledger import RestartLedger, RestartRecord
from sidecar.policy.rules import seconds
from sidecar.policy.settings import PolicySettings


class RecordClock:
    """Remembers the monotonic time of each restart record it has seen (in memory only)."""

    def __init__(self) -> None:
        self._monotonic_s: dict[RestartRecord, float] = {}

    def pin(self, record: RestartRecord, now_s: float) -> None:
        """A record this process just wrote: it happened now."""
        self._monotonic_s[record] = now_s

    def aged(self, ledger: RestartLedger, now_s: float, wall_s: float) -> RestartLedger:
        """The ledger with each record's time re-expressed as `wall_s` minus its monotonic age."""
        known: dict[RestartRecord, float] = {}
        for record in ledger.records:
            first_seen = self._monotonic_s.get(record)
            if first_seen is None and record.monotonic_s is not None and record.monotonic_s <= now_s:
                first_seen = record.monotonic_s
            if first_seen is None:
                first_seen = now_s - max(0.0, wall_s - record.wall_time_s)
            known[record] = first_seen
        self._monotonic_s = known  # forget records the ledger no longer holds
        return RestartLedger(records=tuple(replace(r, wall_time_s=wall_s - (now_s - known[r])) for r in ledger.records))


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardView:
    """The ledger-derived guard values at one moment."""

    restarts_in_window: int
    budget_wait_s: float  # 0 when another restart fits the budget
    consecutive: int  # restarts in the current series (for the cooldown)
    cooldown_remaining_s: float | None  # None when no cooldown applies


def window_text(settings: PolicySettings) -> str:
    return (
        "the last hour"
        if settings.restart_budget_window_s == 3600
        else "the last " + seconds(settings.restart_budget_window_s)
    )


def guard_view(
    aged: RestartLedger, settings: PolicySettings, wall_s: float, since_healthy_again_s: float | None
) -> GuardView:
    """Budget and cooldown from the aged ledger; the cooldown runs from the later of the last restart and
    vLLM's return from it (`since_healthy_again_s` ago, when this process saw it): a fresh vLLM is not
    restarted again before it has had the cooldown to settle."""
    window = settings.restart_budget_window_s
    count = aged.count_since(wall_s - window)
    wait = aged.budget_wait_s(wall_s, window, settings.max_restarts_per_hour)
    consecutive = aged.consecutive(settings.cooldown_reset_s)
    remaining: float | None = None
    last = aged.last
    if last is not None:
        elapsed = wall_s - last.wall_time_s
        if since_healthy_again_s is not None and since_healthy_again_s < elapsed:
            elapsed = since_healthy_again_s
        left = settings.cooldown_s(consecutive) - elapsed
        remaining = left if left > 0 else None
    return GuardView(
        restarts_in_window=count, budget_wait_s=wait, consecutive=consecutive, cooldown_remaining_s=remaining
    )


def budget_block(view: GuardView, settings: PolicySettings) -> str | None:
    """Why the budget refuses an automatic restart now, or None."""
    if settings.max_restarts_per_hour == 0:
        return "automatic restarts are disabled (max_restarts_per_hour = 0)"
    if view.budget_wait_s <= 0:
        return None
    return (
        f"restart budget exhausted: {plural(view.restarts_in_window, 'restart')} in {window_text(settings)}, "
        f"next allowed in {seconds(view.budget_wait_s)}"
    )


def cooldown_block(view: GuardView) -> str | None:
    if view.cooldown_remaining_s is None:
        return None
    return (
        f"cooldown after restart {view.consecutive} of a series: "
        f"next restart allowed in {seconds(view.cooldown_remaining_s)}"
    )
