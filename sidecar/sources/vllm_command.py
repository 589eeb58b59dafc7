"""The command line vLLM's server runs with, as /proc shows it while vLLM serves. Reads /proc in a worker thread.

vLLM states its flags once, at start (`non-default args: {...}`). A log tail read after hours of serving has
lost that line, and the doctor then gives a relative step ("lower the budget by 0.02 below what you set") where
the flags would give a value; the restart notifications, reading the same tail, say the same. The server's own
command line is what vLLM parsed, so the sidecar reads it while vLLM serves, and a death's reading can use it
where the log no longer states the flags (vLLM's own arguments line, where the log has it, wins).

Read on the first poll that reaches vLLM after one that did not (a new start: vLLM binds its port once its
model is loaded, so its server's process is there), and again at most every `refresh_s` while vLLM answers (a
restart between two polls). What was seen is kept until a read finds another server for the port. Where the
sidecar shares no process namespace with vLLM (another container of a pod without `shareProcessNamespace`),
nothing is found, nothing is kept, and the log alone is read, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sidecar.model.server_command import ServerCommand
from sidecar.parse.vllm_process import ProcessRole, VllmProcesses, serves_port
from sidecar.sources.vllm_processes import find_vllm_processes

REFRESH_S = 300.0


class ServerCommandMemory:
    def __init__(
        self,
        port: int,
        *,
        find: Callable[[int], VllmProcesses] = find_vllm_processes,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._port = port
        self._find = find
        self._clock = clock
        self._wall_clock = wall_clock
        self._refresh_s = refresh_s
        self._read_at: float | None = None
        self.seen: ServerCommand | None = None

    async def observe(self, *, reached: bool, newly_reached: bool) -> None:
        """After each poll: whether it reached vLLM, and whether the one before did not. Never raises."""
        if not reached:
            return
        now = self._clock()
        if not newly_reached and self._read_at is not None and now - self._read_at < self._refresh_s:
            return
        self._read_at = now
        try:
            found = await asyncio.to_thread(self._find, self._port)
        except Exception:  # noqa: BLE001 - /proc's table is a hint for the doctor: never worth a poll
            return
        server = next(
            (
                process
                for process in found.processes
                if process.role is ProcessRole.API_SERVER and serves_port(process.command, self._port)
            ),
            None,
        )
        if server is not None:
            where = f"vLLM's server command line (pid {server.pid})"
            self.seen = ServerCommand(where=where, command=server.command, seen_wall_s=self._wall_clock())
