"""Shared test helpers: where the recorded expositions live, and the session's real systemd user manager.

Without root (or systemd, unshare, dbus) the tests that use `user_systemd` are skipped with the reason, except
in CI (`CI=true`), where a missing systemd is a failure: CI must never skip the real-systemd tests silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actuators.user_systemd import UserSystemd, missing_requirements, start_user_systemd

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = FIXTURES / "expositions"


def exposition_files() -> list[Path]:
    return sorted(EXPOSITIONS.glob("*.prom"))


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


# Run in parallel (`pytest -n 2`, pytest-xdist, `--dist loadgroup`), the tests that start a real vLLM run one after
# another on one worker: each loads a model for 20-60 s of CPU, the session's `vllm_server` is then started once,
# and two at once on a 2-core machine would only slow each other past their deadlines. Likewise the tests that
# boot the Debian rootfs with systemd-nspawn (it locks the directory) or build the image.
SERIAL_GROUPS = {
    "real-vllm": (
        "tests/e2e/",
        "tests/chaos/test_real_vllm_chaos.py",
        "tests/actuators/test_real_vllm_hang_e2e.py",
        "tests/doctor/test_real_vllm.py",
    ),
    "machine": (
        "tests/ship/test_systemd_deploy.py",
        "tests/cause/test_journal_log.py",
        "tests/ship/test_container_image.py",
    ),
}


# tryfirst: xdist reads the groups in its own collection hook, which would otherwise run before this one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    for item in items:
        where = Path(item.path).resolve().relative_to(root).as_posix()
        for group, prefixes in SERIAL_GROUPS.items():
            if where.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))
