"""The record of what the sidecar changed in vLLM's flags, and the flags file vLLM's next start reads. File I/O.

Two files in --state-dir: `remediations.json` (every step, oldest first: the record) and `vllm-flags.env` (one
line, `VLLM_SIDECAR_FLAGS="--max-model-len 992"`, replayed from the record each time it changes, so the two
never disagree). Both are written atomically. The daemon and `vllm-sidecar remediations` (a person reverting)
may both write: each change is read, made and written under an exclusive lock on `remediations.lock`, and the
daemon reads the record afresh before each decision, so neither overwrites what the other just wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from sidecar.actuators.remediation_record import (
    RecordError,
    RecordFormatError,
    document_of,
    flags_text,
    steps_from,
    trimmed,
)
from sidecar.model.remediation import Step
from sidecar.shell.state_file import StateFile, write_atomically

RECORD_FILE = "remediations.json"
FLAGS_FILE = "vllm-flags.env"
LOCK_FILE = "remediations.lock"


class FlagsTarget(Protocol):
    """Where the record of changes lives and where vLLM's next start reads the flags: the state dir's files
    (systemd, exec) or the owning Deployment (Kubernetes, `sidecar.actuators.kube_flags`). Both methods raise
    RecordError only."""

    @property
    def where(self) -> str:
        """In words, for /status and the notifications: "/var/lib/vllm-sidecar/vllm-flags.env"."""
        ...

    @property
    def restarts_on_change(self) -> bool:
        """True when writing changed flags restarts vLLM with them by itself (a Deployment's args: the rollout
        replaces the pods), so no restart is to be asked for; False when they wait for vLLM's next start."""
        ...

    async def read(self) -> list[Step]:
        """The record, oldest first."""
        ...

    async def update(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        """Apply `edit` to the record as it is now and write it with the flags it implies; the new record."""
        ...


class RemediationStore:
    restarts_on_change = False  # the files are read at vLLM's next start, which a restart brings

    def __init__(self, state_dir: Path, flags_file: Path | None = None) -> None:
        self.state_dir = state_dir
        self.record_path = state_dir / RECORD_FILE
        self.flags_path = flags_file if flags_file is not None else state_dir / FLAGS_FILE
        self._lock_path = state_dir / LOCK_FILE

    @property
    def where(self) -> str:
        return str(self.flags_path)

    async def read(self) -> list[Step]:
        return await asyncio.to_thread(self.steps)

    async def update(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        return await asyncio.to_thread(self.change, edit)  # off the loop: the lock may be a person's for a moment

    def steps(self) -> list[Step]:
        """The record, oldest first ([] without one). Raises RecordError for one that cannot be used: the
        sidecar then changes nothing (a record it cannot read could hide a held flag)."""
        loaded = StateFile(self.record_path).load()
        if loaded.problem is not None:
            raise RecordError(loaded.problem)
        if loaded.document is None:
            return []
        try:
            return steps_from(loaded.document)
        except RecordFormatError as error:
            raise RecordError(f"{self.record_path}: {error}") from None

    def change(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        """Read the record, apply `edit`, write the record and the flags file, all under the lock; the new
        steps. Raises RecordError (nothing is written then)."""
        with self._locked():
            steps = trimmed(edit(self.steps()))
            try:
                StateFile(self.record_path).save(dict(document_of(steps)))
                write_atomically(self.flags_path, flags_text(steps).encode(), mode=0o644)
            except OSError as error:
                raise RecordError(f"cannot write {self.state_dir}: {error.strerror or error}") from None
        return steps

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise RecordError(f"cannot lock {self._lock_path}: {error.strerror or error}") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock
