"""Shared test helpers: where the recorded expositions live, and the session's real systemd user manager.

Without root (or systemd, unshare, dbus) the tests that use `user_systemd` are skipped with the reason, except
in CI (`CI=true`), where a missing systemd is a failure: CI must never skip the real-systemd tests silently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.actuators.user_systemd import UserSystemd, missing_requirements, start_user_systemd

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = FIXTURES / "expositions"


def exposition_files() -> list[Path]:
    return sorted(EXPOSITIONS.glob("*.prom"))


@pytest.fixture(autouse=True)
def _logging_put_back() -> Iterator[None]:
    """A test that runs the daemon's command line in-process configures logging onto that test's captured
    streams (structlog and the root logger); every later test that logs would write to them closed (CI runs 8
    and 9 lost a dozen tests that way). Each test's logging is put back as it found it."""
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


def required_in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def user_systemd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserSystemd]:
    """One user manager for the session; each test writes its own units (unique names) into `unit_dir`."""
    missing = missing_requirements()
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"a real systemd user manager is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(f"real systemd user manager not available: {missing}")
    manager = start_user_systemd(tmp_path_factory.mktemp("systemd"))
    try:
        yield manager
    finally:
        manager.stop()
