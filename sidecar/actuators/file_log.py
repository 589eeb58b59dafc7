"""vLLM's log from a file (`--vllm-log FILE`): its last 256 KiB, read in a worker thread. File I/O.

Only a regular file is read, opened without blocking: a FIFO or a device would block the read (or never
end) and hold the thread, which the daemon then waits for when it stops. A file that is replaced or
rotated is simply read again by name next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from pathlib import Path

from sidecar.actuators.log_source import MAX_LOG_BYTES, LogRead, LogRun, LogUnreadableError, Wanted


class FileLog:
    def __init__(self, path: Path, *, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.path = path
        self._max_bytes = max_bytes

    @property
    def where(self) -> str:
        return f"file {self.path}"

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        """The whole tail as one run: a file does not say where one start of vLLM ends (the caller finds it)."""
        del until_wall_s, wanted  # a file has no timestamps the sidecar could trust, and no instances
        text = await asyncio.to_thread(tail_text, self.path, self._max_bytes)
        return LogRead(where=self.where, runs=(LogRun(text=text, label=""),))


def tail_text(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a regular file as text (a partial first line dropped); LogUnreadableError saying
    why not (the caller names the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise LogUnreadableError(error.strerror or str(error)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LogUnreadableError("not a regular file")
        start = max(0, info.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        raw = _read_at_most(fd, max_bytes)  # bounded even when the file grows while it is read
    except OSError as error:
        raise LogUnreadableError(error.strerror or str(error)) from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if start > 0:
        _, _, raw = raw.partition(b"\n")  # the line cut in two by the start of the tail
    return raw.decode("utf-8", errors="replace")


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
