"""The sidecar daemon's own history: its /status document or its state directory's restart ledger. Pure.

A /status document arrives here already checked against its schema (`sidecar.model.status`, by the tool that
read it: `sidecar/doctor_cli/history_reading.py`), so its keys are read as the daemon wrote them. A ledger of
the wrong shape is a `HistoryError` with one line saying what is wrong, never a crash.
"""

from __future__ import annotations

from sidecar.doctor.evidence import HistoryFacts, counted
from sidecar.model.status import StatusDocument
from sidecar.policy.ledger import RestartLedger, RestartLedgerError


class HistoryError(ValueError):
    """The history document is not one the doctor can read."""


def from_status(status: StatusDocument, source: str) -> HistoryFacts:
    """Facts from the daemon's GET /status document."""
    policy = status.get("policy")
    return HistoryFacts(
        source=source, restarts=counted(policy["restarts"]) if policy is not None else (), status=status
    )


def from_ledger(document: object, source: str) -> HistoryFacts:
    """Facts from the restart ledger the daemon keeps in its --state-dir."""
    try:
        ledger = RestartLedger.from_dict(document)
    except RestartLedgerError as error:
        raise HistoryError(f"{source} is not a restart ledger: {error}") from None
    counts: dict[str, int] = {}
    for record in ledger.records:
        counts[record.reason.value] = counts.get(record.reason.value, 0) + 1
    return HistoryFacts(source=source, restarts=tuple(sorted(counts.items())))
