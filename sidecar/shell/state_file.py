"""A small JSON document kept in --state-dir that must survive the sidecar's own restart. Does file I/O.

Writes are atomic (a temporary file in the same directory, fsync, rename, fsync of the directory), so a
sidecar killed mid-write leaves the old document or the new one, never half of each. A document that
cannot be read is moved aside and reported; the caller decides what is safe to assume without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.file_cap import FileTooLargeError, read_capped_file

MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Loaded:
    document: dict[str, object] | None  # None when there was no file or it could not be used
    problem: str | None  # one line when a file existed but could not be used


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Loaded:
        raw = b""
        problem = None
        try:
            raw = read_capped_file(self.path, MAX_BYTES)
        except FileNotFoundError:
            return Loaded(document=None, problem=None)
        except FileTooLargeError:
            problem = f"{self.path} is over {MAX_BYTES} bytes"  # moved aside below, like any unusable document
        except OSError as error:
            return Loaded(document=None, problem=f"cannot read {self.path}: {error.strerror or error}")
        document: object = None
        if problem is None:
            try:
                document = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as error:
                problem = f"{self.path} is not valid JSON ({error})"
            if problem is None and not isinstance(document, dict):
                problem = f"{self.path} does not hold a JSON object"
        if problem is not None:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                self.path.rename(aside)
            return Loaded(document=None, problem=f"{problem}; moved aside to {aside.name}")
        assert isinstance(document, dict)  # noqa: S101 - checked just above
        return Loaded(document=document, problem=None)

    def save(self, document: dict[str, object]) -> None:
        """Replace the file atomically; raises OSError (the caller reports it and keeps running)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"
        descriptor, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
