"""The suite's verdict (tests/suite.py): what is rerun alone, and when a failure that passes alone still fails
the suite (always, unless it is quarantined with its cause)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.suite import (
    FAST_PATHS,
    MAX_RERUNS,
    Quarantined,
    QuarantineError,
    failed_tests,
    lanes,
    read_quarantine,
    to_rerun,
    verdict,
)

ONE = ["tests/unit/test_a.py::test_b"]
MANY = [f"tests/unit/test_a.py::test_{n}" for n in range(MAX_RERUNS + 1)]


@pytest.mark.parametrize(
    ("codes", "failed", "rerun"),
    [
        ((0, 0), [], []),
        ((0, 1), ONE, ONE),  # tests failed in one run: rerun them
        ((1, 0), ONE, ONE),
        ((1, 1), MANY[:MAX_RERUNS], MANY[:MAX_RERUNS]),
        ((1, 0), MANY, []),  # too many: a broken change, not contention
        ((0, 1), [], []),  # failed, but no list to rerun from
        ((0, 2), ONE, []),  # interrupted
        ((3, 1), ONE, []),  # pytest's internal error in the other run
        ((4, 0), ONE, []),  # usage error
        ((5, 1), ONE, []),  # nothing collected
    ],
)
def test_only_a_few_failures_of_runs_that_finished_are_rerun(
    codes: tuple[int, int], failed: list[str], rerun: list[str]
) -> None:
    assert to_rerun(codes, failed) == rerun


LISTED = (Quarantined(test=ONE[0], cause="races the journal's flush", since="2026-11-29"),)


@pytest.mark.parametrize(
    ("codes", "rerun", "quarantine", "passes"),
    [
        ((0, 0), None, (), True),
        ((0, 1), 0, (), False),  # failed in a run, passed alone: flaky, and flaky is red
        ((1, 0), 0, (), False),
        ((0, 1), 0, LISTED, True),  # ... unless quarantined with its cause
        ((1, 1), 0, LISTED, True),
        ((0, 1), 1, LISTED, False),  # failed alone too: broken, quarantine or not
        ((1, 0), None, LISTED, False),  # failed and not rerun (too many)
        ((0, 2), None, (), False),
        ((0, 2), 0, LISTED, False),  # an interrupted run does not pass on a rerun
        ((5, 0), 0, LISTED, False),
    ],
)
def test_a_failure_fails_the_suite_unless_it_passed_alone_and_is_quarantined(
    codes: tuple[int, int], rerun: int | None, quarantine: tuple[Quarantined, ...], passes: bool
) -> None:
    ok, lines = verdict(codes, [] if codes == (0, 0) else ONE, rerun, quarantine)
    assert ok is passes
    assert len(lines) == (0 if codes == (0, 0) else 1)


def test_the_summary_says_flaky_or_broken_and_what_to_do() -> None:
    two = [ONE[0], "tests/unit/test_a.py::test_c"]
    ok, lines = verdict((0, 1), two, 0, LISTED)
    assert not ok  # one of the two is not listed
    assert lines == [
        f"FLAKY {ONE[0]} (passed only alone: quarantined)",
        "FLAKY tests/unit/test_a.py::test_c (passed only alone: fix it, or list it with its cause in "
        "tests/quarantine.toml)",
    ]
    assert verdict((1, 0), ONE, 1, ())[1] == [f"FAILED {ONE[0]} (failed again alone: broken, not flaky)"]


def test_the_quarantine_file_needs_a_cause_and_a_date_for_each_test() -> None:
    text = '[[test]]\ntest = "tests/a.py::t"\ncause = "x races y"\nsince = "2026-11-29"\n'
    assert read_quarantine(text) == (Quarantined(test="tests/a.py::t", cause="x races y", since="2026-11-29"),)
    assert read_quarantine("# nothing listed\n") == ()
    with pytest.raises(QuarantineError, match="test #1 has no cause"):
        read_quarantine('[[test]]\ntest = "tests/a.py::t"\ncause = " "\nsince = "2026-11-29"\n')
    with pytest.raises(QuarantineError, match=r"quarantine\.toml"):
        read_quarantine("[[test]\n")


def test_the_shipped_quarantine_reads() -> None:
    from tests.suite import QUARANTINE

    read_quarantine(QUARANTINE.read_text())


def test_the_failures_are_read_from_pytests_own_cache(tmp_path: Path) -> None:
    assert failed_tests(tmp_path) == []  # no cache yet
    folder = tmp_path / "v" / "cache"
    folder.mkdir(parents=True)
    (folder / "lastfailed").write_text(json.dumps({"tests/b.py::t": True, "tests/a.py::t[x]": True}))
    assert failed_tests(tmp_path) == ["tests/a.py::t[x]", "tests/b.py::t"]
    (folder / "lastfailed").write_text("{not json")
    assert failed_tests(tmp_path) == []


def test_every_slow_test_file_runs_in_exactly_one_lane() -> None:
    # A file two lanes both take runs twice, at once; one no lane takes never runs.
    root = Path(__file__).resolve().parents[2]

    def under(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    files = [str(path.relative_to(root)) for path in (root / "tests").rglob("test_*.py")]
    slow = [path for path in files if not any(under(path, folder) for folder in FAST_PATHS)]
    assert len(slow) > 50
    for path in slow:
        taken = [
            lane.name
            for lane in lanes()
            if any(under(path, folder) for folder in lane.paths)
            and not any(under(path, ignored) for ignored in lane.ignores)
        ]
        assert len(taken) == 1, f"{path}: {taken}"
