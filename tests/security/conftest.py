"""Fixtures of the security tests: a CA and a server certificate per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import required_in_ci
from tests.security.certs import Pair, issue, make_ca, openssl_missing


@pytest.fixture
def ca(tmp_path: Path) -> Pair:
    missing = openssl_missing()
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"openssl is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(missing)
    return make_ca(tmp_path / "ca")


@pytest.fixture
def server_pair(ca: Pair, tmp_path: Path) -> Pair:
    return issue(ca, tmp_path / "server", "sidecar-a")
