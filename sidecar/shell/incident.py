"""Takes an incident: vLLM's stacks, its log's tail, its last /metrics and the /status history, into a folder.

Does I/O: reads /proc, runs py-spy, reads vLLM's log through its `LogSource`, writes under
`<state-dir>/incidents/` (`incident_files`). Before a restart the capture is bounded by `timeout_s` in all, so
it never holds a restart back longer: whatever is not in by then is listed as not captured, and the folder is
written with the rest. It never raises: a capture that fails is one log line (`incident_failed`), and the
restart goes on. What is captured, and why something is not, is in the manifest (docs/incidents.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from sidecar.actuators.log_source import LogRead, LogSource, LogUnreadableError, Wanted
from sidecar.model.incident import IncidentRef, Kind, Trigger
from sidecar.parse.vllm_process import ProcessRole, VllmProcess, VllmProcesses
from sidecar.report.document import finite
from sidecar.report.incident import incident_name, manifest_document, summary_line
from sidecar.shell.incident_files import IncidentFiles, Piece, plan
from sidecar.sources.stack_dump import NO_PY_SPY, StackDump, dump_stack

INCIDENTS_DIR = "incidents"
WRITE_SHARE = 0.2  # of the time limit kept for writing the folder, at most WRITE_RESERVE_S
WRITE_RESERVE_S = 1.0
NOT_SEEN = (
    "no vLLM process in /proc: vLLM's processes are gone, or the sidecar shares no process namespace with them "
    "(Kubernetes: shareProcessNamespace: true, deploy/kubernetes/add-incidents)"
)
GONE_AFTER_CRASH = "vLLM's processes that died are gone: it came back without a restart by the sidecar"


class StackDumper(Protocol):
    """`sidecar.sources.stack_dump.dump_stack`, or a test's twin."""

    async def __call__(self, py_spy: Path, pid: int, *, timeout_s: float) -> StackDump: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsRead:
    text: str  # vLLM's /metrics body as last read
    wall_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentSettings:
    state_dir: Path
    keep: int
    timeout_s: float
    max_bytes: int
    vllm_url: str


class IncidentRecorder:
    def __init__(
        self,
        settings: IncidentSettings,
        *,
        logger: FilteringBoundLogger,
        log_source: LogSource | None,
        py_spy: Path | None,
        find_processes: Callable[[], VllmProcesses],
        last_metrics: Callable[[], MetricsRead | None],
        status_history: Callable[[], list[object]],
        dump: StackDumper = dump_stack,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._log = logger
        self._log_source = log_source
        self._py_spy = py_spy
        self._find_processes = find_processes
        self._last_metrics = last_metrics
        self._status_history = status_history
        self._dump = dump
        self._clock = clock
        self.files = IncidentFiles(settings.state_dir / INCIDENTS_DIR, keep=settings.keep, logger=logger)
        self.last: IncidentRef | None = None
        self.kept: Counter[str] = Counter()  # incidents written, by trigger
        # Parts not kept, by kind; a crash's stacks are not counted: its processes are gone, nothing could.
        self.missing: Counter[str] = Counter()

    @property
    def has_py_spy(self) -> bool:
        return self._py_spy is not None

    def reserve(self, cause: str, wall_time_s: float) -> IncidentRef:
        """The incident's folder, named now (a notification can name it before it is written)."""
        name = incident_name(wall_time_s, cause, self.files.names())
        return IncidentRef(path=str(self.files.root / name), cause=cause, wall_time_s=wall_time_s)

    async def capture(
        self, incident: IncidentRef, *, trigger: Trigger, state: str, reason: str, wanted: Wanted
    ) -> IncidentRef | None:
        """Take the incident and write its folder, within `timeout_s` in all; None when nothing was written."""
        started = self._clock()
        try:
            written = await self._capture(incident, trigger=trigger, state=state, reason=reason, wanted=wanted)
        except Exception as error:  # noqa: BLE001 - an incident must never cost the restart or the daemon
            self._log.error("incident_failed", incident=incident.path, error=f"{type(error).__name__}: {error}")
            return None
        if written is not None:
            self.last = incident
            self._log.warning(
                "incident", path=incident.path, summary=written, duration_s=round(self._clock() - started, 3)
            )
            return incident
        return None

    async def _capture(
        self, incident: IncidentRef, *, trigger: Trigger, state: str, reason: str, wanted: Wanted
    ) -> str | None:
        settings = self._settings
        started = self._clock()
        reserve_s = min(WRITE_RESERVE_S, settings.timeout_s * WRITE_SHARE)
        gather_s = settings.timeout_s - reserve_s
        pieces: list[Piece] = []
        stack_task = asyncio.ensure_future(self._stacks(trigger, gather_s))
        log_task = asyncio.ensure_future(self._read_log(incident, wanted, gather_s))
        done, pending = await asyncio.wait({stack_task, log_task}, timeout=gather_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        late = f"not in within the incident's {gather_s:g} s"
        stacks, command = stack_task.result() if stack_task in done else ([Piece.missing(Kind.STACKS, late)], None)
        pieces += stacks
        log, seen = log_task.result() if log_task in done else (Piece.missing(Kind.LOG, late), None)
        pieces.append(log)
        # vLLM gone (after a crash, or in another process namespace): its command line as seen while it served
        command = command or seen
        pieces.append(self._metrics(incident))
        pieces.append(self._history())
        planned = plan(pieces, settings.max_bytes)
        document = manifest_document(
            incident=incident,
            trigger=trigger,
            state=state,
            reason=reason,
            vllm_url=settings.vllm_url,
            captured=planned.captured,
            not_captured=planned.not_captured,
            capture_s=self._clock() - started,
            timeout_s=settings.timeout_s,
            max_bytes=settings.max_bytes,
            vllm_command=command,
        )
        self.kept[str(trigger)] += 1
        for part in planned.not_captured:
            if not (trigger is Trigger.AFTER_CRASH and part["kind"] == Kind.STACKS):
                self.missing[part["kind"]] += 1
        left_s = max(0.0, settings.timeout_s - (self._clock() - started))
        write = asyncio.ensure_future(asyncio.to_thread(self.files.write, incident, planned, document))
        written, _ = await asyncio.wait({write}, timeout=left_s)
        if not written:  # the thread finishes on its own; the restart does not wait for it
            self._log.warning("incident_write_slow", incident=incident.path, waited_s=round(left_s, 3))
        elif write.result() is not None:
            self._log.error("incident_failed", incident=incident.path, error=write.result())
            return None
        return summary_line(document)

    async def _stacks(self, trigger: Trigger, timeout_s: float) -> tuple[list[Piece], str | None]:
        """vLLM's stacks, and its API server's command line (for the doctor: the flags its log may not state)."""
        if trigger is Trigger.AFTER_CRASH:
            return [Piece.missing(Kind.STACKS, GONE_AFTER_CRASH)], None
        deadline = self._clock() + timeout_s
        found = await asyncio.to_thread(self._find_processes)
        command = next((p.command for p in found.processes if p.role is ProcessRole.API_SERVER and p.command), None)
        py_spy = self._py_spy
        if py_spy is None:
            return [Piece.missing(Kind.STACKS, NO_PY_SPY)], command
        if not found.processes:
            return [Piece.missing(Kind.STACKS, NOT_SEEN)], command
        left_s = max(0.05, deadline - self._clock())
        dumps = await asyncio.gather(
            *(self._dump_one(py_spy, process, left_s, found.note) for process in found.processes)
        )
        return list(dumps), command

    async def _dump_one(self, py_spy: Path, process: VllmProcess, timeout_s: float, how: str | None) -> Piece:
        dump = await self._dump(py_spy, process.pid, timeout_s=timeout_s)
        role = str(process.role)
        if dump.text is None:
            return Piece.missing(Kind.STACKS, dump.error or "py-spy gave nothing", pid=process.pid, role=role)
        header = f"# {process.title} (pid {process.pid}, state {process.state}; py-spy {dump.duration_s:.2f} s)\n"
        return Piece.found(
            Kind.STACKS,
            (header + dump.text).encode(),
            pid=process.pid,
            role=role,
            note=process.title + (f"; {how}" if how else ""),
            cut=dump.truncated,
        )

    async def _read_log(self, incident: IncidentRef, wanted: Wanted, timeout_s: float) -> tuple[Piece, str | None]:
        """vLLM's log, and the server command line the sidecar saw while vLLM served, where it saw one."""
        source = self._log_source
        if source is None:
            return Piece.missing(Kind.LOG, "no vLLM log to read: set --vllm-log FILE"), None
        try:
            async with asyncio.timeout(timeout_s):
                read = await source.read(until_wall_s=incident.wall_time_s, wanted=wanted)
        except TimeoutError:
            return Piece.missing(Kind.LOG, f"reading {source.where} took longer than {timeout_s:g} s"), None
        except LogUnreadableError as error:
            return Piece.missing(Kind.LOG, f"cannot read {source.where}: {error}"), None
        log = Piece.found(Kind.LOG, _log_text(read).encode(), note=_log_note(read), tail=True)
        return log, read.command.command if read.command is not None else None

    def _metrics(self, incident: IncidentRef) -> Piece:
        read = self._last_metrics()
        if read is None:
            return Piece.missing(Kind.METRICS, "no /metrics read from vLLM since the sidecar started")
        age_s = max(0.0, incident.wall_time_s - read.wall_time_s)
        return Piece.found(Kind.METRICS, read.text.encode(), note=f"vLLM's /metrics as read {age_s:.1f} s before")

    def _history(self) -> Piece:
        documents = self._status_history()
        if not documents:
            return Piece.missing(Kind.STATUS_HISTORY, "no poll yet")
        rendered = [json.dumps(finite(document), allow_nan=False, default=str) for document in documents]
        return Piece.listed(Kind.STATUS_HISTORY, rendered, note=f"the last {len(rendered)} /status documents")


def _log_text(read: LogRead) -> str:
    return "".join(run.text if run.text.endswith("\n") or not run.text else run.text + "\n" for run in read.runs)


def _log_note(read: LogRead) -> str:
    runs = [run.label + (f" ({run.ended})" if run.ended else "") for run in read.runs if run.label]
    return read.where + (": " + ", ".join(runs) if runs else "")
