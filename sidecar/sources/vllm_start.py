"""Whether someone else is starting vLLM: a vLLM server for its port that started after vLLM went. Reads /proc.

Asked only while nothing listens at vLLM's address and the restart adapter says nobody else will start it
(`--actuator exec`; a systemd unit stopped with no job queued). An operator, or a script of theirs, may be
starting vLLM by hand; a restart from the sidecar would kill that load and start it over. vLLM binds its port
only once its model is loaded, so until then its process is the only sign: a `vllm serve` or
`vllm.entrypoints.openai.api_server` process for the same port (its `--port`, 8000 when not given), started
since the last poll that reached vLLM began. Where the sidecar cannot see vLLM's processes (another container without a
shared process namespace) there is no sign, and nobody else starting it is what the adapter said.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.parse.vllm_process import redacted
from sidecar.parse.vllm_process import serves_port as serves_port  # noqa: PLC0414 - re-exported, as before
from sidecar.sources.proc import read_proc_text


def boot_clock_s() -> float:
    """Seconds since boot, the clock /proc's process start times count in."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True, slots=True, kw_only=True)
class StartedServer:
    pid: int
    started_boot_s: float
    command: str  # its command line, secrets redacted and shortened for a log line


class VllmStartWatch:
    def __init__(self, port: int, *, proc: Path = Path("/proc"), own_pid: int | None = None) -> None:
        self._port = port
        self._proc = proc
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")

    def started_since(self, since_boot_s: float) -> list[StartedServer]:
        """vLLM servers for the port started at or after `since_boot_s` (to /proc's clock tick), alive (not zombies).
        Never raises."""
        found: list[StartedServer] = []
        try:
            entries = [entry for entry in self._proc.iterdir() if entry.name.isdigit()]
        except OSError:
            return []
        for entry in entries:
            if int(entry.name) == self._own_pid:
                continue
            # Gone meanwhile, or not ours to read: None, and no sign.
            command = (read_proc_text(entry / "cmdline") or "").replace("\0", " ").strip()
            if not serves_port(command, self._port):
                continue
            fields = (read_proc_text(entry / "stat") or "").rpartition(")")[2].split()
            if len(fields) < 20 or fields[0] in ("Z", "X"):
                continue
            started = int(fields[19]) / self._ticks_per_s
            # /proc counts a start in clock ticks (10 ms), rounded down: one in the tick `since_boot_s` falls in is
            # as likely after it as before (and a server started a tick before a poll cannot have answered it).
            if started + 1 / self._ticks_per_s > since_boot_s:
                found.append(
                    StartedServer(pid=int(entry.name), started_boot_s=started, command=redacted(command)[:160])
                )
        return found
