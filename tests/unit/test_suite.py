"""The suite's verdict (tests/suite.py): what is rerun alone, and when two runs and a rerun make a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.suite import MAX_RERUNS, failed_tests, passed, to_rerun

ONE = ["tests/unit/test_a.py::test_b"]


@pytest.mark.parametrize(
    ("nice_code", "failed", "rerun"),
    [
        (0, [], []),
        (1, ONE, ONE),  # tests failed: rerun them
        (1, [f"t{n}" for n in range(MAX_RERUNS)], [f"t{n}" for n in range(MAX_RERUNS)]),
        (1, [f"t{n}" for n in range(MAX_RERUNS + 1)], []),  # too many: a broken change, not a starved run
        (1, [], []),  # failed, but no list to rerun from
        (2, ONE, []),  # interrupted
        (3, ONE, []),  # pytest's internal error
        (4, ONE, []),  # usage error
        (5, [], []),  # nothing collected
    ],
)
def test_only_a_few_failed_tests_are_rerun(nice_code: int, failed: list[str], rerun: list[str]) -> None:
    assert to_rerun(nice_code, failed) == rerun


@pytest.mark.parametrize(
    ("timing", "nice", "rerun", "verdict"),
    [
        (0, 0, None, True),
        (0, 1, 0, True),  # failed niced, passed alone
        (0, 1, 1, False),  # failed twice
        (0, 1, None, False),  # failed niced and not rerun
        (1, 0, None, False),  # the timing run is never rerun
        (1, 1, 0, False),
        (0, 2, None, False),
        (0, 2, 0, False),  # an interrupted niced run does not pass on a rerun
        (0, 5, None, False),
    ],
)
def test_the_suite_passes_only_when_every_test_passed_once_at_least_alone(
    timing: int, nice: int, rerun: int | None, verdict: bool
) -> None:
    assert passed(timing, nice, rerun) is verdict


def test_the_failures_are_read_from_pytests_own_cache(tmp_path: Path) -> None:
    assert failed_tests(tmp_path) == []  # no cache yet
    folder = tmp_path / "v" / "cache"
    folder.mkdir(parents=True)
    (folder / "lastfailed").write_text(json.dumps({"tests/b.py::t": True, "tests/a.py::t[x]": True}))
    assert failed_tests(tmp_path) == ["tests/a.py::t[x]", "tests/b.py::t"]
    (folder / "lastfailed").write_text("{not json")
    assert failed_tests(tmp_path) == []
