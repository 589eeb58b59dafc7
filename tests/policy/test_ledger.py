"""RestartLedger: counting, series, budget arithmetic, clock jumps, and the JSON round trip."""

from __future__ import annotations

import json
import math

import pytest

from sidecar.policy import RestartLedger, RestartLedgerError, RestartReason, RestartRecord
from sidecar.policy.ledger import MAX_RECORDS

NOW = 1_750_000_000.0


def ledger(*ages_s: float, reason: RestartReason = RestartReason.ENGINE_HUNG) -> RestartLedger:
    """Records `ages_s` seconds before NOW, oldest first (a negative age lies in the future)."""
    return RestartLedger(records=tuple(RestartRecord(wall_time_s=NOW - a, reason=reason) for a in ages_s))


def test_record_appends_and_keeps_the_newest() -> None:
    book = RestartLedger()
    for i in range(MAX_RECORDS + 5):
        book = book.record(RestartRecord(wall_time_s=float(i), reason=RestartReason.MANUAL))
    assert len(book.records) == MAX_RECORDS
    assert book.records[0].wall_time_s == 5.0
    assert book.last == RestartRecord(wall_time_s=float(MAX_RECORDS + 4), reason=RestartReason.MANUAL)
    assert RestartLedger().last is None


def test_count_since_counts_records_in_the_future() -> None:
    book = ledger(4000, 3000, 10, -500)  # -500: the wall clock went back after this restart
    assert book.count_since(NOW - 3600) == 3


@pytest.mark.parametrize(
    ("ages", "expected"),
    [
        ((), 0),
        ((10,), 1),
        ((700, 10), 2),
        ((1300, 700, 10), 3),
        ((9000, 700, 10), 2),  # 8300 s between the first two: a new series began
        ((700, -50), 2),  # a negative gap (clock went back) is a short gap
    ],
)
def test_consecutive(ages: tuple[float, ...], expected: int) -> None:
    assert ledger(*ages).consecutive(3600) == expected


def test_budget_wait() -> None:
    assert ledger(3000, 10).budget_wait_s(NOW, 3600, 3) == 0
    # 3 in the hour: the oldest (3000 s ago) leaves in 600 s.
    assert ledger(3000, 2000, 10).budget_wait_s(NOW, 3600, 3) == pytest.approx(600)
    # 4 in the hour (a manual restart went over): two must leave; the second oldest leaves in 1600 s.
    assert ledger(3000, 2000, 1000, 10).budget_wait_s(NOW, 3600, 3) == pytest.approx(1600)
    # A record in the future waits for the clock to pass it, plus the window.
    assert ledger(3000, 2000, -100).budget_wait_s(NOW, 3600, 3) == pytest.approx(600)
    assert math.isinf(ledger().budget_wait_s(NOW, 3600, 0))


def test_round_trip_through_json() -> None:
    book = RestartLedger(
        records=(
            RestartRecord(wall_time_s=NOW - 100, reason=RestartReason.OOM_FORECAST, detail="forecast 412 s"),
            RestartRecord(wall_time_s=NOW, reason=RestartReason.MANUAL),
        )
    )
    document = json.loads(json.dumps(book.to_dict()))
    assert document["version"] == 1
    assert RestartLedger.from_dict(document) == book


def test_monotonic_times_are_read_back_only_for_the_boot_that_wrote_them() -> None:
    book = RestartLedger(records=(RestartRecord(wall_time_s=NOW, reason=RestartReason.MANUAL, monotonic_s=12.5),))
    document = json.loads(json.dumps(book.to_dict()))
    assert RestartLedger.from_dict(document, same_boot=True) == book
    assert RestartLedger.from_dict(document).records[0].monotonic_s is None  # another boot: wall time only
    document["restarts"][0]["monotonic_s"] = "soon"  # not a number: dropped, the record itself still counts
    assert RestartLedger.from_dict(document, same_boot=True).records[0].monotonic_s is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "JSON object"),
        ({"version": 2, "restarts": []}, "version"),
        ({"version": 1}, "'restarts' must be a list"),
        ({"version": 1, "restarts": ["x"]}, r"restarts\[0\] must be an object"),
        ({"version": 1, "restarts": [{"wall_time_s": "1", "reason": "manual"}]}, "wall_time_s"),
        ({"version": 1, "restarts": [{"wall_time_s": True, "reason": "manual"}]}, "wall_time_s"),
        ({"version": 1, "restarts": [{"wall_time_s": 1e400, "reason": "manual"}]}, "wall_time_s"),
        ({"version": 1, "restarts": [{"wall_time_s": 1, "reason": "gremlins"}]}, "reason"),
        ({"version": 1, "restarts": [{"wall_time_s": 1, "reason": ["manual"]}]}, "reason"),
        ({"version": 1, "restarts": [{"wall_time_s": 1, "reason": "manual", "detail": 3}]}, "detail"),
    ],
)
def test_from_dict_rejects_what_it_did_not_write(document: object, message: str) -> None:
    with pytest.raises(RestartLedgerError, match=message):
        RestartLedger.from_dict(document)
