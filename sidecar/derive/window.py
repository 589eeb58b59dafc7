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

    def newest_first(self) -> Iterator[Snapshot]:
        return reversed(self._snapshots)

    def after(self, snapshot: Snapshot | None) -> list[Snapshot] | None:
        """The snapshots pushed after `snapshot`, oldest first (all of them for None); None when it is gone."""
        if snapshot is None:
            return list(self._snapshots)
        newer: list[Snapshot] = []
        for candidate in reversed(self._snapshots):
            if candidate is snapshot:
                newer.reverse()
                return newer
            newer.append(candidate)
        return None

    def __len__(self) -> int:
        return len(self._snapshots)


class Follower:
    """Numbers a window's snapshots in push order, for derivations that keep state between ticks.

    `advance` hands over the snapshots pushed since its last call, oldest first, and says whether the state
    built so far must be dropped (the first call, another window, or a window that no longer holds the last
    snapshot handed over): then it hands over everything the window holds, numbered from 0. A window only
    appends and forgets its oldest, so it always holds the snapshots numbered `oldest` to `count - 1`.
    """

    def __init__(self) -> None:
        self._window: Window | None = None
        self._last: Snapshot | None = None
        self.count = 0  # snapshots handed over since the last start-over
        self.oldest = 0  # number of the oldest snapshot the window still holds

    def advance(self, window: Window) -> tuple[list[Snapshot], bool]:
        newer = window.after(self._last) if window is self._window else None
        start_over = newer is None
        if newer is None:
            self._window, self.count = window, 0
            newer = list(window.since(float("-inf")))
        self.count += len(newer)
        self.oldest = self.count - len(window)
        self._last = window.latest()
        return newer, start_over
