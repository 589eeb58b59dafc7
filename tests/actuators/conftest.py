"""The real systemd user manager the systemd and sd_notify tests run against (see `user_systemd.py`).

Without root (or systemd, unshare, dbus) those tests are skipped with the reason, except in CI (`CI=true`),
where a missing systemd is a failure: CI must never skip the real-systemd tests silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .user_systemd import UserSystemd, missing_requirements, start_user_systemd


def systemd_required() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def user_systemd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserSystemd]:
    """One user manager for the session; each test writes its own units (unique names) into `unit_dir`."""
    missing = missing_requirements()
    if missing is not None:
        if systemd_required():
            pytest.fail(f"a real systemd user manager is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(f"real systemd user manager not available: {missing}")
    manager = start_user_systemd(tmp_path_factory.mktemp("systemd"))
    try:
        yield manager
    finally:
        manager.stop()
