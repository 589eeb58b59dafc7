"""Follows the daemon's JSON log as it grows: the story's lines it has not read yet. Does I/O (reads a file)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from sidecar.demo.events import SidecarStory, logged_at_s


class SidecarLog:
    def __init__(self, path: Path, started_wall_s: float) -> None:
        self.path = path
        self._started_wall_s = started_wall_s  # the demo's start, Unix time: the log is stamped in wall time
        self._offset = 0
        self._story = SidecarStory()

    def new_lines(self) -> list[tuple[float | None, str]]:
        """(when it was logged, since the demo's start, or None; the line) for each record told, in order."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next read
        self._offset += len(whole)
        lines: list[tuple[float | None, str]] = []
        for line in whole.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                said = self._story.line(record) if isinstance(record, dict) else None
                if said is not None:
                    lines.append((logged_at_s(record, self._started_wall_s), said))
        return lines
