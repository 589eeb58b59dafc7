"""Tells whose process a GPU PID is by reading /proc/<pid>/comm and /proc/<pid>/cmdline.

Does I/O (reads two small files per PID); call it off the event loop. Never raises: a PID that cannot be read
(gone, another PID namespace, no permission) is ``ProcessOwner.UNKNOWN`` with no name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sidecar.model.gpu import ProcessOwner

# vLLM names its engine processes with setproctitle ("VLLM::EngineCore"); /proc truncates comm to 15 bytes, so
# the pattern is matched against the full cmdline too.
DEFAULT_VLLM_PATTERN = r"vllm|VLLM::"
# A command line can be megabytes (ARG_MAX); the interpreter and the first arguments, where vLLM's name
# appears, fit in far less, and nothing more is worth holding per GPU process per poll.
MAX_PROC_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessIdentity:
    name: str | None
    owner: ProcessOwner


def read_proc_text(path: Path) -> str | None:
    """A /proc file's first MAX_PROC_FILE_BYTES as text; None when it cannot be read."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PROC_FILE_BYTES)
    except OSError:  # gone, permission denied, or not in our PID namespace: all mean "cannot tell"
        return None
    return raw.decode("utf-8", errors="replace")


def identify_process(pid: int, *, proc_root: Path, pattern: re.Pattern[str]) -> ProcessIdentity:
    """Name and owner of ``pid`` as seen under ``proc_root``.

    NVML reports host PIDs; inside a container without the host PID namespace they are unreadable (UNKNOWN),
    which is the honest answer rather than guessing.
    """
    base = proc_root / str(pid)
    comm = read_proc_text(base / "comm")
    cmdline = read_proc_text(base / "cmdline")
    if comm is None and cmdline is None:
        return ProcessIdentity(name=None, owner=ProcessOwner.UNKNOWN)
    argv = [arg for arg in (cmdline or "").split("\0") if arg]
    name = comm.strip() if comm is not None and comm.strip() else None
    if name is None and argv:
        name = argv[0].rsplit("/", 1)[-1]
    texts = [text for text in (comm, " ".join(argv)) if text]
    owner = ProcessOwner.VLLM if any(pattern.search(text) for text in texts) else ProcessOwner.OTHER
    return ProcessIdentity(name=name, owner=owner)
