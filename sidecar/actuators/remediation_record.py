"""The record of --remediate's changes as a JSON document, and the flags it implies for vLLM's command line.

One format wherever the record lives: `<state-dir>/remediations.json` beside the flags file (systemd, exec),
or an annotation of vLLM's Deployment (Kubernetes). `steps_from` checks a document from outside against the
same classes `document_of` writes; a wrong one is `RecordFormatError` with one line naming the key.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from sidecar.document_error import first_error
from sidecar.model.remediation import FLAGS_VARIABLE, Step, StepState, shown
from sidecar.policy.remediation import flags_in_effect

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


class RecordFormatError(ValueError):
    """A record document that is not one; one line."""


class RecordError(Exception):
    """The record cannot be read or written, wherever it lives (a flags target raises nothing else); one line."""


def steps_from(document: object) -> list[Step]:
    try:
        record = _RECORD.validate_python(document)
    except ValidationError as error:
        raise RecordFormatError(first_error(error)) from None
    return [_step(step) for step in record["steps"]]


def document_of(steps: list[Step]) -> RecordDocument:
    return {"version": RECORD_VERSION, "steps": [_document(step) for step in steps]}


def trimmed(steps: list[Step], keep: int = MAX_STEPS, max_bytes: int | None = None) -> list[Step]:
    """At most `keep` steps, and the record at most `max_bytes` of JSON where given: the oldest settled steps go
    first, but never a pending one, a held one (its hold would end unseen) or one whose dropping would change
    the flags in effect (the newest standing step of a flag sets it; the first of a flag says what the file
    held before). What must stay, stays, over either bound."""
    kept = list(steps)
    in_effect = flags_in_effect(kept)
    for step in list(steps):
        over = len(kept) > keep or (max_bytes is not None and _size(kept) > max_bytes)
        if not over:
            break
        if step.state is StepState.PENDING or step.held:
            continue
        without = [other for other in kept if other is not step]
        if flags_in_effect(without) == in_effect:
            kept = without
    return kept


def _size(steps: list[Step]) -> int:
    return len(json.dumps(document_of(steps), separators=(",", ":")).encode())


def flag_words(steps: list[Step]) -> list[str]:
    """The flags the steps set, as vLLM's command line takes them: ["--max-model-len", "992"]."""
    words: list[str] = []
    for flag, value in sorted(flags_in_effect(steps).items()):
        words += [flag, shown(flag, value)]
    return words


def flags_text(steps: list[Step]) -> str:
    """The flags file: a comment, then the one variable vLLM's start appends to its command line."""
    words = " ".join(flag_words(steps))
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
