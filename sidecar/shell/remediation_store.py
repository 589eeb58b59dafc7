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
from typing import Literal, Protocol

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from sidecar.model.remediation import FLAGS_VARIABLE, Step, StepState, shown
from sidecar.policy.remediation import flags_in_effect
from sidecar.shell.state_file import StateFile, write_atomically

RECORD_FILE = "remediations.json"
FLAGS_FILE = "vllm-flags.env"
LOCK_FILE = "remediations.lock"
RECORD_VERSION = 1
MAX_STEPS = 200  # the oldest settled steps go first: a year of a change a day is far more than anyone reads


class StepDocument(TypedDict):
    flag: str
    before: float
    after: float
    file_before: float | None
    cause: str
    why: str
    wall_time_s: float
    state: Literal["pending", "confirmed", "reverted"]
    outcome: str
    resolved_wall_time_s: float | None
    held: bool


class RecordDocument(TypedDict):
    version: int
    steps: list[StepDocument]


_RECORD = TypeAdapter(RecordDocument)


class RecordError(Exception):
    """The record cannot be read or written; one line."""


class FlagsTarget(Protocol):
    """Where the record of changes lives and where vLLM's next start reads the flags: the state dir's files
    (systemd, exec) or the owning Deployment (Kubernetes). Both methods raise RecordError only."""

    @property
    def where(self) -> str:
        """In words, for /status and the notifications: "/var/lib/vllm-sidecar/vllm-flags.env"."""
        ...

    async def read(self) -> list[Step]:
        """The record, oldest first."""
        ...

    async def update(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        """Apply `edit` to the record as it is now and write it with the flags it implies; the new record."""
        ...


class RemediationStore:
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
            record = _RECORD.validate_python(loaded.document)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise RecordError(f"{self.record_path}: {where}: {first['msg']}") from None
        return [_step(document) for document in record["steps"]]

    def change(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        """Read the record, apply `edit`, write the record and the flags file, all under the lock; the new
        steps. Raises RecordError (nothing is written then)."""
        with self._locked():
            steps = edit(self.steps())
            settled = [index for index, step in enumerate(steps) if step.state is not StepState.PENDING]
            drop = set(settled[: max(0, len(steps) - MAX_STEPS)])
            steps = [step for index, step in enumerate(steps) if index not in drop]
            document: RecordDocument = {"version": RECORD_VERSION, "steps": [_document(step) for step in steps]}
            try:
                StateFile(self.record_path).save(dict(document))
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


def flags_text(steps: list[Step]) -> str:
    """The flags file: a comment, then the one variable vLLM's start appends to its command line."""
    flags = flags_in_effect(steps)
    words = " ".join(f"{flag} {shown(flag, value)}" for flag, value in sorted(flags.items()))
    return (
        "# Written by vllm-sidecar (--remediate): the flags it set for vLLM's next start. Do not edit;\n"
        "# `vllm-sidecar remediations list` shows why, `vllm-sidecar remediations revert` takes them back.\n"
        f'{FLAGS_VARIABLE}="{words}"\n'
    )


def _step(document: StepDocument) -> Step:
    return Step(
        flag=document["flag"],
        before=document["before"],
        after=document["after"],
        file_before=document["file_before"],
        cause=document["cause"],
        why=document["why"],
        wall_time_s=document["wall_time_s"],
        state=StepState(document["state"]),
        outcome=document["outcome"],
        resolved_wall_time_s=document["resolved_wall_time_s"],
        held=document["held"],
    )


def _document(step: Step) -> StepDocument:
    return {
        "flag": step.flag,
        "before": step.before,
        "after": step.after,
        "file_before": step.file_before,
        "cause": step.cause,
        "why": step.why,
        "wall_time_s": step.wall_time_s,
        "state": step.state.value,
        "outcome": step.outcome,
        "resolved_wall_time_s": step.resolved_wall_time_s,
        "held": step.held,
    }
