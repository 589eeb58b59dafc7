"""The progress bar on stderr while a load test runs (rich). Does terminal I/O.

Only on a terminal: a pipe or a log file gets nothing, so the report stays the only output there.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn

from sidecar.loadtest.runner import RunProgress


class ProgressBar:
    """A context manager and a runner `ProgressSink`: percent of the sending bound, and what is in flight."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console if console is not None else Console(stderr=True),
        )
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        self._task = self._progress.add_task("sending", total=100.0, detail="")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._progress.stop()

    def update(self, progress: RunProgress) -> None:
        if self._task is None:
            return
        detail = f"{progress.sent} sent, {progress.ok} ok, {progress.failed} failed, {progress.in_flight} in flight"
        self._progress.update(
            self._task,
            completed=100.0 * progress.sending_fraction,
            description="sending" if progress.sending else "finishing",
            detail=detail,
        )


def wanted(*, quiet: bool, console: Console | None = None) -> bool:
    """A bar only on a terminal, and not with --quiet."""
    return not quiet and (console if console is not None else Console(stderr=True)).is_terminal
