"""vLLM's log as its platform's reader returns it, with the server command line the sidecar last saw. No I/O.

Every reader of vLLM's log in the daemon (the restart notifications' cause, --remediate, incidents) reads it
through this, so each can use vLLM's flags where the log tail no longer states them
(`sidecar.sources.vllm_command`).
"""

from __future__ import annotations

import dataclasses

from sidecar.actuators.log_source import LogRead, LogSource, Wanted
from sidecar.sources.vllm_command import ServerCommandMemory


class LogWithCommand:
    def __init__(self, source: LogSource, memory: ServerCommandMemory) -> None:
        self._source = source
        self._memory = memory

    @property
    def where(self) -> str:
        return self._source.where

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        read = await self._source.read(until_wall_s=until_wall_s, wanted=wanted)
        return dataclasses.replace(read, command=self._memory.seen)
