"""A small JSON document kept in --state-dir that must survive the sidecar's own restart. Does file I/O.

Writes are atomic (a temporary file in the same directory, fsync, rename, fsync of the directory), so a
sidecar killed mid-write leaves the old document or the new one, never half of each. A document that
cannot be read is moved aside and reported; the caller decides what is safe to assume without it.
`directory_problem` and `StateFile.access_problem` say at start why a directory or a file cannot be used
(a file where a directory should be, no permission, a read-only file system), so the daemon can refuse to
start rather than run on without its state.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
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

    def access_problem(self) -> str | None:
        """Why the file, where there is one, cannot be read: something else in its place, or no permission.
        None when it is readable or missing. Its content is `load`'s business (a corrupt one is moved aside)."""
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            return None
        except OSError as error:
            return f"cannot read {self.path}: {_why(error)}"
        if not stat.S_ISREG(mode):  # a directory, a FIFO (opening it would block), a device
            return f"{self.path} is not a regular file"
        try:
            with self.path.open("rb"):
                pass
        except OSError as error:
            return f"cannot read {self.path}: {_why(error)}"
        return None

    def save(self, document: dict[str, object]) -> None:
        """Replace the file atomically; raises OSError (the caller reports it and keeps running)."""
        write_atomically(self.path, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data`: the old content or the new, never half of each. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def directory_problem(path: Path, *, create: bool) -> str | None:
    """Why `path` cannot hold state files, or None. With `create`, it must be a directory this process can
    write in: made (with its parents) when missing, and tried with a file written and removed. Without, a
    missing directory is fine (nothing will be written there), but what exists must be a directory."""
    blocker = _not_a_directory(path)
    if blocker is not None:
        return "it is a file, not a directory" if blocker == path else f"{blocker} is a file, not a directory"
    try:
        exists = stat.S_ISDIR(path.stat().st_mode)
    except FileNotFoundError:
        exists = False
    except OSError as error:
        return f"cannot look it up: {_why(error)}"
    if not create:
        return None
    if not exists:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return f"cannot create it: {_why(error)}"
    try:
        descriptor, trial = tempfile.mkstemp(prefix=".write-check-", dir=path)
    except OSError as error:
        return f"cannot write in it: {_why(error)}"
    os.close(descriptor)
    with contextlib.suppress(OSError):
        os.unlink(trial)
    return None


def _not_a_directory(path: Path) -> Path | None:
    """The first component of `path`, from the root down, that exists but is not a directory."""
    for part in reversed((path, *path.parents)):
        try:
            mode = part.stat().st_mode
        except OSError:
            return None  # missing (so is everything under it), or not ours to look at: reported by the caller
        if not stat.S_ISDIR(mode):
            return part
    return None


def _why(error: OSError) -> str:
    """The system's reason, with who asked when it is a permission (a container's UID is often the answer)."""
    reason = error.strerror or str(error)
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"{reason} (running as uid {os.geteuid()})"
    return reason
