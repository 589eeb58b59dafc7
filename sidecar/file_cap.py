"""Reading a local file without letting it grow past a cap. Reads files.

`Path.read_bytes()` reads whatever is there: a 10 GB file, a log that a misconfigured mount points at, or
`/dev/zero` (whose size is 0, so a size check before reading does not help either) would take the daemon's
memory with it. Here at most `max_bytes + 1` bytes are ever read, however the file reports its size.
"""

from __future__ import annotations

from pathlib import Path


class FileTooLargeError(OSError):
    """The file holds more than the cap allows. An `OSError`, so callers that report unreadable files report this."""

    def __init__(self, path: Path, limit_bytes: int) -> None:
        super().__init__(f"{path} is over the {limit_bytes} byte limit")
        self.limit_bytes = limit_bytes


def read_capped_file(path: Path, max_bytes: int) -> bytes:
    """The whole content of `path`; `FileTooLargeError` when it holds more than `max_bytes`."""
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(path, max_bytes)
    return data
