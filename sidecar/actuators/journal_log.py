"""vLLM's log from the systemd journal: its unit's entries of the last boot, one run per invocation. Runs journalctl.

Why journalctl and not the journal API: the API is libsystemd's C library (`sd_journal_*`), reachable from
Python only through a compiled binding (systemd-python, which needs libsystemd's headers to build) or ctypes
code of our own; journalctl ships with systemd wherever there is a journal, knows its file format,
rotation and access rules, and filters by unit and time itself. One short process per read (a read happens
only when vLLM died or is restarted) costs nothing worth saving.

What is read: `journalctl --unit=UNIT` (or `--user-unit=` on a user manager) `--until=@T --reverse
--lines=N --output=json`, only the fields used. Newest first, so the byte bound keeps the newest entries,
and reading stops (the process group is killed) as soon as a bound is reached. `--until` leaves out what
happened after the notification was decided, such as the restart the sidecar itself asked for in the same
moment. Only the newest entry's boot is kept (`_BOOT_ID`): an invocation of an earlier boot is never the
one that just died. Not `--boot`, which takes the boot from /proc: inside a container (nspawn, LXC) a
service sandboxed with ProtectKernelTunables= or ProtectControlGroups= (as the shipped unit is) sees the
host's boot ID there, not the one its journal records, and `--boot` then finds nothing.

Runs: entries are grouped by invocation ID (`_SYSTEMD_INVOCATION_ID` on the unit's output,
`INVOCATION_ID`/`USER_INVOCATION_ID` on systemd's own lines about it), in order of appearance; systemd's
lines also say how an invocation ended ("Main process exited, code=killed, status=9/KILL"). So when
systemd's `Restart=` has already started vLLM again, the invocation that died is still there, whole.

Failures, each one line: journalctl missing, no journal on this machine, no permission (the sidecar's
user must be in group `systemd-journal`, or `adm`), no entries of the unit, journalctl failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from sidecar.actuators.log_source import MAX_LOG_BYTES, LogRead, LogRun, LogUnreadableError, Wanted
from sidecar.actuators.unit_name import validate_unit_name

MAX_ENTRIES = 5000  # a crash traceback is a few hundred lines; a start under a thousand
MAX_RAW_BYTES = 4 * 2**20  # of JSON from journalctl, whatever the message bytes (its fields add ~300 bytes each)
MAX_STDERR_BYTES = 4096
INVOCATION_FIELDS = ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID", "USER_INVOCATION_ID")  # the unit's output, systemd's
FIELDS = ("MESSAGE", "MESSAGE_ID", "_BOOT_ID", *INVOCATION_FIELDS)
# systemd's catalog IDs of the lines that say an invocation ended (sd-messages.h)
PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"  # "Main process exited, code=..., status=..."
UNIT_FAILED = "d9b373ed55a64feb8242e02dbe79a49c"  # "Failed with result 'exit-code'."
UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"  # "Deactivated successfully."
UNIT_STOPPED = "9d1aaa27d60140bd96365438aad20286"  # "Stopped <description>."
ENDINGS = (PROCESS_EXIT, UNIT_FAILED, UNIT_SUCCESS, UNIT_STOPPED)  # the first found says it best
NO_ACCESS = "insufficient permissions"
NOT_ALL = "not seeing messages from other users and the system"
GROUP_HINT = "the sidecar's user must be in group systemd-journal (SupplementaryGroups=systemd-journal)"
_CHUNK = 64 * 2**10


@dataclass(slots=True)
class _Invocation:
    id: str | None
    lines: list[str] = field(default_factory=list)
    endings: dict[str, str] = field(default_factory=dict)  # MESSAGE_ID -> the line


class JournalLog:
    def __init__(
        self,
        unit: str,
        *,
        bus: Literal["system", "user"] = "system",
        command: Sequence[str] = ("journalctl",),  # a test runs it inside a container: ("nsenter", ..., "journalctl")
        max_bytes: int = MAX_LOG_BYTES,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.unit = validate_unit_name(unit)
        self.bus = bus
        self._command = tuple(command)
        self._max_bytes = max_bytes
        self._max_entries = max_entries

    @property
    def where(self) -> str:
        return f"journal of {self.unit} ({self.bus} manager)"

    def argv(self, until_wall_s: float) -> list[str]:
        return self._unit_argv(
            f"--until=@{until_wall_s:.6f}",
            "--reverse",
            f"--lines={self._max_entries}",
            "--output=json",
            f"--output-fields={','.join(FIELDS)}",
        )

    def _unit_argv(self, *options: str) -> list[str]:
        unit = f"--user-unit={self.unit}" if self.bus == "user" else f"--unit={self.unit}"
        return [*self._command, "--no-pager", unit, *options]

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        del wanted  # every invocation in the tail comes back; the caller picks
        raw, stderr, code = await self._run(self.argv(until_wall_s))
        said = _said(stderr)
        if code not in (0, None):  # None: stopped by us at a bound, after reading what counts
            hint = f"; {GROUP_HINT}" if NO_ACCESS in stderr else ""
            raise LogUnreadableError(f"journalctl exited with {code}: {said or 'no message'}{hint}")
        invocations = _invocations(raw, self._max_bytes)
        if not invocations:
            if not said:  # with --output=json journalctl keeps its notices to itself; its plain mode says them
                _, stderr, _ = await self._run(self._unit_argv("--lines=0"))
                said = _said(stderr)
            why = f" (journalctl: {said})" if said else ""
            hint = f"; {GROUP_HINT}" if NOT_ALL in stderr else ""
            raise LogUnreadableError(f"no entries of {self.unit} in the journal{why}{hint}")
        runs = tuple(
            LogRun(
                text="\n".join(invocation.lines),
                label=f"invocation {invocation.id}" if invocation.id else "entries without an invocation ID",
                ended=next((invocation.endings[i] for i in ENDINGS if i in invocation.endings), None),
                failed=_failed(invocation),
            )
            for invocation in invocations
        )
        return LogRead(where=self.where, runs=runs)

    async def _run(self, argv: list[str]) -> tuple[list[bytes], str, int | None]:
        env = {**os.environ, "SYSTEMD_PAGER": "", "PAGER": "cat", "SYSTEMD_COLORS": "0", "LC_ALL": "C.UTF-8"}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group, so a cancelled read kills all of it
            )
        except OSError as error:
            raise LogUnreadableError(f"cannot run {argv[0]}: {error.strerror or error}") from None
        assert process.stdout is not None  # noqa: S101 - asked for with PIPE above
        assert process.stderr is not None  # noqa: S101
        errors = asyncio.ensure_future(_capped(process.stderr, MAX_STDERR_BYTES))
        try:
            lines, complete = await self._entries(process.stdout)
            if not complete:
                _kill(process)
            code = await process.wait()
            stderr = (await errors).decode("utf-8", errors="replace")
            return lines, stderr, code if complete else None
        finally:
            if process.returncode is None:  # cancelled (the caller's deadline): nothing of it may outlive us
                _kill(process)
                with contextlib.suppress(ProcessLookupError):
                    await process.wait()
            errors.cancel()

    async def _entries(self, stdout: asyncio.StreamReader) -> tuple[list[bytes], bool]:
        """JSON lines, newest first, until the end (True) or a bound (False)."""
        lines: list[bytes] = []
        pending = b""
        total = 0
        while True:
            chunk = await stdout.read(_CHUNK)
            if not chunk:
                if pending.strip():
                    lines.append(pending)
                return lines, True
            total += len(chunk)
            *complete, pending = (pending + chunk).split(b"\n")
            lines.extend(complete)
            if total >= MAX_RAW_BYTES or len(lines) >= self._max_entries:
                return lines[: self._max_entries], False


def _invocations(raw: list[bytes], max_bytes: int) -> list[_Invocation]:
    """Entries (newest first) of the newest boot, grouped by invocation, oldest first, within `max_bytes` of
    message text."""
    kept: list[tuple[str | None, str, str | None]] = []
    size = 0
    boot: object = None
    for line in raw:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by a bound, or not JSON at all: nothing to read in it
        if not isinstance(entry, dict):
            continue
        message = _message(entry.get("MESSAGE"))
        if message is None:
            continue
        boot = entry.get("_BOOT_ID") if not kept else boot
        if entry.get("_BOOT_ID") != boot:
            break  # an earlier boot's: so is all that follows (older)
        size += len(message) + 1
        if size > max_bytes and kept:
            break
        invocation = next(
            (str(entry[key]) for key in INVOCATION_FIELDS if isinstance(entry.get(key), str) and entry[key]), None
        )
        message_id = entry.get("MESSAGE_ID")
        kept.append((invocation, message, message_id if isinstance(message_id, str) else None))
    groups: dict[str | None, _Invocation] = {}
    current: _Invocation | None = None
    for invocation, message, message_id in reversed(kept):
        if invocation is not None or current is None:  # an entry without an ID belongs with the one before it
            current = groups.setdefault(invocation, _Invocation(id=invocation))
        current.lines.append(message)
        if message_id in ENDINGS:
            current.endings.setdefault(message_id, message)
    return list(groups.values())


def _failed(invocation: _Invocation) -> bool | None:
    # systemd logs a main process's exit at the default level only when it failed (status != 0, a signal)
    if PROCESS_EXIT in invocation.endings or UNIT_FAILED in invocation.endings:
        return True
    return False if invocation.endings else None


def _message(value: object) -> str | None:
    """MESSAGE as text: journalctl writes a message that is not UTF-8 (or has control bytes) as byte values."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(byte, int) and 0 <= byte < 256 for byte in value):
        return bytes(value).decode("utf-8", errors="replace")
    return None


async def _capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The first `limit` bytes of `stream`, reading (and dropping) the rest so the writer never blocks."""
    kept = b""
    while chunk := await stream.read(_CHUNK):
        kept += chunk[: max(0, limit - len(kept))]
    return kept


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _said(stderr: str) -> str:
    """What journalctl said on stderr, as one short line."""
    if NOT_ALL in stderr:
        return f"you are currently {NOT_ALL}"  # its three-line hint, of which only this part informs
    return " ".join(stderr.split())[:300]
