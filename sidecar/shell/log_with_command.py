"""vLLM's log as its platform's reader returns it, with vLLM's command line. No I/O of its own.

Every reader of vLLM's log in the daemon (the restart notifications' cause, --remediate, incidents) reads it
through this, so each can use vLLM's flags where the log tail no longer states them: the server command line the
sidecar last saw in /proc (`sidecar.sources.vllm_command`: what vLLM really ran), else what the platform
declares (Kubernetes: vLLM's container in the pod's spec, `sidecar.actuators.kube_command`), else none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from sidecar.actuators.log_source import LogRead, LogSource, Wanted
from sidecar.model.server_command import ServerCommand
from sidecar.sources.vllm_command import ServerCommandMemory


class LogWithCommand:
    def __init__(
        self,
        source: LogSource,
        memory: ServerCommandMemory,
        *,
        declared: Callable[[], Awaitable[ServerCommand | None]] | None = None,
    ) -> None:
        self._source = source
        self._memory = memory
        self._declared = declared

    @property
    def where(self) -> str:
        return self._source.where

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        read = await self._source.read(until_wall_s=until_wall_s, wanted=wanted)
        command = self._memory.seen
        if command is None and self._declared is not None:
            command = await self._declared()
        return dataclasses.replace(read, command=command)
