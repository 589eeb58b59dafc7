"""The interface every GPU source offers to the shell (NVML now; a simulated GPU later). No I/O here."""

from __future__ import annotations

from typing import Protocol

from sidecar.model.gpu import GpuReading
from sidecar.model.source import SourceResult


class GpuSource(Protocol):
    async def read(self) -> SourceResult[GpuReading]: ...

    def close(self) -> None: ...
