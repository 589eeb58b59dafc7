"""What happened, as the demo tells it: one line per event of the sidecar's JSON log, and the event list. Pure.

The sidecar logs each step of a scenario's story as it takes it (a state change, an action, the engine probe
and its answer, a restart held back, the restart adapter's outcome); each becomes one line, stamped with the
time the sidecar logged it, counted from the demo's start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

_NO_DRAIN = ", no drain"  # how the policy ends a hard restart's drain action (an engine dead or hung)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at_s: float  # seconds since the demo started
    text: str

    @property
    def line(self) -> str:
        return f"{self.at_s:5.0f} s  {self.text}"


class _Missing(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return "?"


def _action(record: Mapping[str, object], told: bool = False) -> str:
    """An action; its reason only where the state change just before did not give it already."""
    action, reason = str(record.get("action")), str(record.get("reason"))
    if action == "drain" and reason.endswith(_NO_DRAIN):
        # The policy begins every restart with its drain action; a hard one's says it drains nothing.
        return "sidecar decides: restart at once, no drain (the engine's requests cannot finish)"
    return f"sidecar decides: {action}" if told else f"sidecar decides: {action}: {reason}"


def _probe_sent(record: Mapping[str, object]) -> str:
    what = "a warm-up completion" if record.get("kind") == "warm_up" else "the engine probe (a 1-token completion)"
    return f"sidecar sends {what}: {record.get('reason')}"


def _probe_answer(record: Mapping[str, object]) -> str:
    outcome = str(record.get("event")).removeprefix("probe_").replace("_", " ")
    return f"sidecar's probe: {outcome} after {record.get('duration_s')} s: {record.get('detail')}"


def _restart_outcome(record: Mapping[str, object]) -> str:
    line = (
        f"sidecar: restart adapter ({record.get('adapter')}) {record.get('status')} after {record.get('duration_s')} s"
    )
    # A done restart's detail is the demo's own line, already told.
    return line if record.get("status") == "done" else f"{line}: {record.get('detail')}"


_TEMPLATES: dict[str, str] = {
    "source_failed": "sidecar: cannot read {source}: {error}",
    "source_ok": "sidecar: reading {source}",
    "problem_found": "sidecar: {problem}",
    "problem_resolved": "sidecar: resolved: {problem}",
    "vllm_health_failing": "sidecar: vLLM /health failing",
    "vllm_health_ok": "sidecar: vLLM /health ok",
    "policy_state": "sidecar policy: {previous} -> {state}: {reason}",
    "restart_blocked": "sidecar would restart ({restart}), but {detail}",
}
_WORDED: dict[str, Callable[[Mapping[str, object]], str]] = {
    "action": _action,
    "probe_sent": _probe_sent,
    "probe_answered": _probe_answer,
    "probe_no_answer": _probe_answer,
    "probe_inconclusive": _probe_answer,
    "restart_outcome": _restart_outcome,
}


def sidecar_line(record: Mapping[str, object]) -> str | None:
    """The line for one record of the sidecar's log, or None for a record the story does not tell."""
    event = str(record.get("event"))
    worded = _WORDED.get(event)
    if worded is not None:
        return worded(record)
    template = _TEMPLATES.get(event)
    return None if template is None else template.format_map(_Missing(record))


class SidecarStory:
    """The sidecar's log records as lines, each reason told once: an action taken for a reason its state change
    (or an action since) has just given reads as the action alone (the policy logs the reason with each)."""

    def __init__(self) -> None:
        self._told: set[str] = set()  # the reasons given since the last state change

    def line(self, record: Mapping[str, object]) -> str | None:
        event, reason = record.get("event"), str(record.get("reason"))
        if event == "policy_state":
            self._told = {reason}
        elif event == "action":
            told = reason in self._told
            self._told.add(reason)
            return _action(record, told=told)
        return sidecar_line(record)


def logged_at_s(record: Mapping[str, object], started_wall_s: float) -> float | None:
    """When the sidecar logged `record`, in seconds since the demo started (at `started_wall_s`, Unix time)."""
    stamp = record.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp() - started_wall_s
    except ValueError:
        return None


class EventLog:
    """The events in the order they happened: a stamp never goes back, so the list reads in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, at_s: float, text: str) -> Event:
        # A sidecar line logged a moment before a line the demo already wrote (read with the log's next lines)
        # keeps its place after it, stamped the same second.
        last = self.events[-1].at_s if self.events else at_s
        event = Event(at_s=max(at_s, last), text=text)
        self.events.append(event)
        return event

    @property
    def lines(self) -> list[str]:
        return [event.line for event in self.events]
