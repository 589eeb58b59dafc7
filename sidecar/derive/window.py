"""A bounded, time-ordered window of snapshots. Pure: the caller supplies every timestamp."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sidecar.model.snapshot import Snapshot


class Window:
    """Keeps the snapshots of the last `span_s` seconds (and never more than `max_snapshots`)."""

    def __init__(self, *, span_s: float, max_snapshots: int = 10_000) -> None:
        if span_s <= 0:
            raise ValueError("span_s must be positive")
        self.span_s = span_s
        self._snapshots: deque[Snapshot] = deque(maxlen=max_snapshots)

    def push(self, snapshot: Snapshot) -> None:
        if self._snapshots and snapshot.monotonic_s < self._snapshots[-1].monotonic_s:
            raise ValueError("snapshots must be pushed in time order")
        self._snapshots.append(snapshot)
        horizon = snapshot.monotonic_s - self.span_s
        while self._snapshots[0].monotonic_s < horizon:
            self._snapshots.popleft()

    def since(self, start_s: float) -> Iterator[Snapshot]:
        """Snapshots taken at or after `start_s`, oldest first."""
        return (snapshot for snapshot in self._snapshots if snapshot.monotonic_s >= start_s)

    def latest(self) -> Snapshot | None:
        return self._snapshots[-1] if self._snapshots else None

    def __len__(self) -> int:
        return len(self._snapshots)
