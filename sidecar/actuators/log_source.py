"""What a reader of vLLM's own log hands back, per platform (journal, pod log, file). No I/O here.

A reader returns the tail of the log split into runs, oldest first, as far as the platform knows them: one
run per systemd invocation of the unit, per container instance of the pod, or the whole tail of a file
(the caller splits a run further at each vLLM start it finds). Every reader is bounded in bytes, returns
within the caller's deadline (cancelling it stops any process or request), and reports a log it cannot
read as `LogUnreadableError` with one line saying why, never anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sidecar.model.server_command import ServerCommand

MAX_LOG_BYTES = 256 * 2**10  # of log text per read (per container instance on Kubernetes): the tail counts


class Wanted(StrEnum):
    """Which run the caller is after; lets a reader skip a request (the Kubernetes one asks for less)."""

    DIED = "died"  # the run that died: the last one, or the one before when vLLM was brought back since
    LAST = "last"  # the run that is (or was) up when asked: a planned restart is about to end it


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRun:
    text: str  # the run's lines, oldest first
    label: str  # which run, for the reader's `where`: "invocation 2a1472a2…", "previous container"; "" for all
    ended: str | None = None  # how the platform says it ended ("Main process exited, code=killed, status=9/KILL")
    failed: bool | None = None  # the platform says it ended in a failure (True) or was stopped (False)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRead:
    where: str  # "journal of vllm.service (system manager)", "pod vllm-0 container vllm", "file /var/log/vllm.log"
    runs: tuple[LogRun, ...]  # oldest first; at least one
    # Not from the log: the flags a log tail read after hours of serving no longer states (`server_command`).
    command: ServerCommand | None = None


class LogUnreadableError(Exception):
    """The log cannot be read (no permission, no journal, 403, gone, not a file); the message is one line."""


class LogSource(Protocol):
    @property
    def where(self) -> str:
        """The log, in words, for lines that say it could not be read."""
        ...

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        """The tail of the log up to `until_wall_s` where the platform can tell (the journal can); raises
        `LogUnreadableError` only."""
        ...
