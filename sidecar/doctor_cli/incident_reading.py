"""An incident folder the daemon kept (docs/incidents.md), read as the doctor's evidence. Reads files.

The manifest is checked against its schema (`sidecar.model.incident`, pydantic's TypeAdapter) before anything
in the folder is trusted; then the folder's log is the doctor's log, its metrics the /metrics vLLM served, and
the newest of its /status documents the daemon's history. What the incident could not capture, and its
headline, become lines of the doctor's notes. A folder that is not an incident is `IncidentError`, one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from sidecar.doctor.evidence import HistoryFacts
from sidecar.doctor.history import HistoryError
from sidecar.doctor_cli.history_reading import status_history
from sidecar.document_error import first_error
from sidecar.file_cap import FileTooLargeError, read_capped_file
from sidecar.model.incident import LOG_FILE, MANIFEST_FILE, METRICS_FILE, STATUS_HISTORY_FILE, ManifestDocument

MAX_FILE_BYTES = 64 * 2**20  # an incident is at most --incident-max-bytes (1 GiB at the very most)
MAX_THREADS_SHOWN = 3
_MANIFEST: TypeAdapter[ManifestDocument] = TypeAdapter(ManifestDocument)


class IncidentError(ValueError):
    """The folder is not an incident the doctor can read; the message is the one line to print."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentEvidence:
    folder: Path
    log: Path | None  # the folder's vllm.log, when it holds one
    metrics: bytes | None
    version: str | None  # vLLM's version, as the newest /status document says it
    history: HistoryFacts | None
    lines: tuple[str, ...]  # the headline and what was not captured, for the notes
    command: str | None = None  # vLLM's API server's command line, where the daemon saw its process


def read_incident(folder: Path) -> IncidentEvidence:
    manifest = _manifest(folder)
    lines = [
        f"incident {folder}: {manifest['cause']} at {manifest['time']} ({manifest['trigger']}); the sidecar "
        f"decided: {manifest['decision']['reason']}"
    ]
    lines += [
        f"incident {folder}: {item['kind'].replace('_', ' ')} not captured: {item['why']}"
        for item in manifest["not_captured"]
    ]
    files = {item["file"] for item in manifest["captured"]}
    for item in manifest["captured"]:
        if item["kind"] == "stacks":
            lines.append(_stack_line(folder, item["file"], item["role"], item["pid"]))
    history, version = None, None
    if STATUS_HISTORY_FILE in files:
        try:
            history, version = _history(folder / STATUS_HISTORY_FILE)
        except (OSError, ValueError, HistoryError) as error:
            lines.append(f"incident {folder}: its /status history not used: {error}")
    metrics = None
    if METRICS_FILE in files:
        try:
            metrics = read_capped_file(folder / METRICS_FILE, MAX_FILE_BYTES)
        except (OSError, FileTooLargeError) as error:
            lines.append(f"incident {folder}: its metrics not used: {error}")
    log = folder / LOG_FILE if LOG_FILE in files and (folder / LOG_FILE).is_file() else None
    return IncidentEvidence(
        folder=folder,
        log=log,
        metrics=metrics,
        version=version,
        history=history,
        lines=tuple(lines),
        command=manifest.get("vllm_command"),
    )


def _stack_line(folder: Path, name: str, role: str | None, pid: int | None) -> str:
    """Where each thread of a process waited: the innermost frame py-spy printed for it."""
    try:
        text = read_capped_file(folder / name, MAX_FILE_BYTES).decode("utf-8", errors="replace")
    except OSError as error:
        return f"incident {folder}: {name} not read: {error}"
    tops = top_frames(text)
    shown = "; ".join(tops[:MAX_THREADS_SHOWN]) + (
        f"; {len(tops) - MAX_THREADS_SHOWN} more" if len(tops) > MAX_THREADS_SHOWN else ""
    )
    return f"incident {folder}: {role or 'process'} {pid} ({name}) waited in: {shown or 'no Python frame'}"


def top_frames(dump: str) -> list[str]:
    """`<frame> [<thread>]` for each thread of a py-spy dump: its innermost frame (the first listed), and under
    it the innermost frame of a package (a path with a folder: vllm/..., not threading.py), which says more."""
    threads: list[tuple[str, list[str]]] = []
    for line in dump.splitlines():
        if line.startswith("Thread "):
            name = line.split(":", 1)[1].strip().strip('"') if ":" in line else line.strip()
            threads.append((name, []))
        elif threads and line.startswith((" ", "\t")) and line.strip():
            threads[-1][1].append(line.strip())
    tops = []
    for name, frames in threads:
        if not frames:
            continue
        own = next((frame for frame in frames if "/" in frame.rpartition("(")[2]), frames[0])
        shown = frames[0] if own == frames[0] else f"{frames[0]} under {own}"
        tops.append(f"{shown} [{name}]")
    return tops


def _manifest(folder: Path) -> ManifestDocument:
    path = folder / MANIFEST_FILE
    try:
        document = json.loads(read_capped_file(path, MAX_FILE_BYTES))
    except (OSError, FileTooLargeError) as error:
        why = getattr(error, "strerror", None) or error
        raise IncidentError(f"cannot read --incident {folder}: {path}: {why} (not an incident folder?)") from None
    except ValueError as error:
        raise IncidentError(f"cannot read --incident {folder}: {path} is not JSON: {error}") from None
    try:
        return _MANIFEST.validate_python(document)
    except ValidationError as error:
        raise IncidentError(f"--incident {folder}: {path} is not an incident manifest: {first_error(error)}") from None


def _history(path: Path) -> tuple[HistoryFacts, str | None]:
    """The newest /status document of the history (the one with the policy's part) and vLLM's version."""
    documents = json.loads(read_capped_file(path, MAX_FILE_BYTES))
    if not isinstance(documents, list) or not documents:
        raise HistoryError(f"{path} holds no list of /status documents")
    newest = documents[-1]
    facts = status_history(newest, f"{path} (the newest of {len(documents)} /status documents)")
    return facts, facts.vllm_version
