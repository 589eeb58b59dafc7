"""A /proc tree with the files the sidecar reads to tell whose a PID is (`comm`, `cmdline`). No I/O but the files."""

from __future__ import annotations

from pathlib import Path


def fake_proc(root: Path, entries: dict[int, tuple[str, bytes]]) -> Path:
    """`root` holding `<pid>/comm` and `<pid>/cmdline` for each of `entries` (pid: (comm, NUL-joined cmdline))."""
    for pid, (comm, cmdline) in entries.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm)
        (root / str(pid) / "cmdline").write_bytes(cmdline)
    return root
