"""The suite's verdict (tests/suite.py): what is rerun alone, and when two runs and a rerun make a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.suite import MAX_RERUNS, failed_tests, passed, to_rerun

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


@pytest.mark.parametrize(
    ("codes", "rerun", "verdict"),
    [
        ((0, 0), None, True),
        ((0, 1), 0, True),  # failed in a run, passed alone
        ((1, 0), 0, True),
        ((1, 1), 0, True),
        ((0, 1), 1, False),  # failed twice
        ((1, 0), None, False),  # failed and not rerun
        ((0, 2), None, False),
        ((0, 2), 0, False),  # an interrupted run does not pass on a rerun
        ((5, 0), 0, False),
    ],
)
def test_the_suite_passes_only_when_every_test_passed_in_its_run_or_alone(
    codes: tuple[int, int], rerun: int | None, verdict: bool
) -> None:
    assert passed(codes, rerun) is verdict


def test_the_failures_are_read_from_pytests_own_cache(tmp_path: Path) -> None:
    assert failed_tests(tmp_path) == []  # no cache yet
    folder = tmp_path / "v" / "cache"
    folder.mkdir(parents=True)
    (folder / "lastfailed").write_text(json.dumps({"tests/b.py::t": True, "tests/a.py::t[x]": True}))
    assert failed_tests(tmp_path) == ["tests/a.py::t[x]", "tests/b.py::t"]
    (folder / "lastfailed").write_text("{not json")
    assert failed_tests(tmp_path) == []
