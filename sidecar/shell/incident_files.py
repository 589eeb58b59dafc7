"""An incident's pieces, fitted to its size limit and written as a folder; the oldest folders removed. File I/O.

`plan` decides what each piece keeps (the shares of `sidecar.report.incident`); `IncidentFiles.write` writes
the folder under a hidden temporary name and renames it when complete, so a folder with an incident's name
always holds its manifest; then only the newest `keep` incidents are left. Folders and files are private to
the sidecar's user (0700, 0600): a log or a stack may hold what a prompt said.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from sidecar.model.incident import (
    LOG_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    STATUS_HISTORY_FILE,
    CapturedFile,
    IncidentRef,
    Kind,
    ManifestDocument,
    NotCaptured,
)
from sidecar.report.incident import expired, keep_head, keep_tail, shares, stacks_file

PARTIAL_PREFIX = ".partial-"
_FILES = {Kind.LOG: LOG_FILE, Kind.METRICS: METRICS_FILE, Kind.STATUS_HISTORY: STATUS_HISTORY_FILE}


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    kind: Kind
    data: bytes | None = None  # None: missing (why says why), or documents below
    documents: tuple[str, ...] = ()  # JSON documents, oldest first: the newest that fit are kept whole
    why: str | None = None
    pid: int | None = None
    role: str | None = None
    note: str | None = None
    cut: bool = False  # already cut by its reader
    tail: bool = False  # when cut to fit, keep its end (a log) rather than its start

    @classmethod
    def missing(cls, kind: Kind, why: str, *, pid: int | None = None, role: str | None = None) -> Piece:
        return cls(kind=kind, why=" ".join(why.split()), pid=pid, role=role)

    @classmethod
    def found(
        cls,
        kind: Kind,
        data: bytes,
        *,
        pid: int | None = None,
        role: str | None = None,
        note: str | None = None,
        cut: bool = False,
        tail: bool = False,
    ) -> Piece:
        return cls(kind=kind, data=data, pid=pid, role=role, note=note, cut=cut, tail=tail)

    @classmethod
    def listed(cls, kind: Kind, documents: list[str], *, note: str) -> Piece:
        return cls(kind=kind, documents=tuple(documents), note=note)

    @property
    def present(self) -> bool:
        return self.data is not None or bool(self.documents)

    @property
    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        return len(_json_list(self.documents))

    @property
    def file(self) -> str:
        if self.kind is Kind.STACKS:
            return stacks_file(self.pid or 0, self.role or "other")
        return _FILES[self.kind]


@dataclass(slots=True)
class Plan:
    files: list[tuple[str, bytes]] = field(default_factory=list)
    captured: list[CapturedFile] = field(default_factory=list)
    not_captured: list[NotCaptured] = field(default_factory=list)


def plan(pieces: list[Piece], max_bytes: int) -> Plan:
    """What each piece keeps within `max_bytes`, in the order given (their order of worth)."""
    result = Plan()
    present = [piece for piece in pieces if piece.present]
    allowed = dict(zip(map(id, present), shares([piece.size for piece in present], max_bytes), strict=True))
    for piece in pieces:
        if not piece.present:
            result.not_captured.append(
                {"kind": str(piece.kind), "pid": piece.pid, "role": piece.role, "why": piece.why or "unknown"}
            )
            continue
        share = allowed[id(piece)]
        data = _fitted(piece, share)
        if data is None:
            why = f"larger than the {share} bytes left of the incident's limit (--incident-max-bytes)"
            result.not_captured.append({"kind": str(piece.kind), "pid": piece.pid, "role": piece.role, "why": why})
            continue
        cut = piece.cut or len(data) < piece.size
        result.files.append((piece.file, data))
        result.captured.append(
            {
                "kind": str(piece.kind),
                "file": piece.file,
                "bytes": len(data),
                "truncated": cut,
                "pid": piece.pid,
                "role": piece.role,
                "note": piece.note,
            }
        )
    return result


def _fitted(piece: Piece, share: int) -> bytes | None:
    if piece.data is not None:
        data = keep_tail(piece.data, share) if piece.tail else keep_head(piece.data, share)
        return data if data or not piece.data else None
    documents = list(piece.documents)
    while documents:
        data = _json_list(documents)
        if len(data) <= share:
            return data
        documents.pop(0)  # the oldest goes first
    return None


def _json_list(documents: tuple[str, ...] | list[str]) -> bytes:
    return ("[\n" + ",\n".join(documents) + "\n]\n").encode()


class IncidentFiles:
    def __init__(self, root: Path, *, keep: int, logger: FilteringBoundLogger) -> None:
        self.root = root
        self._keep = keep
        self._log = logger

    def names(self) -> list[str]:
        try:
            return os.listdir(self.root)
        except OSError:
            return []

    def write(self, incident: IncidentRef, planned: Plan, manifest: ManifestDocument) -> str | None:
        """Write the folder, then remove the oldest beyond `keep`; one line saying what failed, or None."""
        final = Path(incident.path)
        partial = final.with_name(PARTIAL_PREFIX + final.name)
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(mode=0o700)
            for name, data in planned.files:
                _write_file(partial / name, data)
            text = json.dumps(manifest, indent=2, allow_nan=False, default=str) + "\n"
            _write_file(partial / MANIFEST_FILE, text.encode())
            partial.rename(final)
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            return f"cannot write {final}: {error.strerror or error}"
        self.prune(keep_also=final.name)
        return None

    def prune(self, *, keep_also: str | None = None) -> None:
        names = self.names()
        doomed = expired(names, self._keep)
        doomed += [name for name in names if name.startswith(PARTIAL_PREFIX)]  # left by a sidecar killed mid-write
        for name in doomed:
            if name == keep_also and self._keep > 0:
                continue
            with contextlib.suppress(OSError):
                shutil.rmtree(self.root / name)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
