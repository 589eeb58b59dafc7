"""The session's real kube-apiserver (kube_apiserver.py) for the Kubernetes adapter's tests, started once.

Without etcd or the apiserver binary the tests that use it skip, except in CI (CI=true, or
VLLM_SIDECAR_REQUIRE_KUBE=1), where that is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from .kube_apiserver import ApiServer, StartError, UnavailableError, start_apiserver

REQUIRE_ENV = "VLLM_SIDECAR_REQUIRE_KUBE"


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1"


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    try:
        server = start_apiserver(tmp_path_factory.mktemp("kube-apiserver"))
    except UnavailableError as error:
        if _required():
            pytest.fail(
                f"the real kube-apiserver is required here (CI=true or {REQUIRE_ENV}=1): {error}", pytrace=False
            )
        pytest.skip(f"real kube-apiserver not available: {error}")
    except StartError as error:
        pytest.fail(f"kube-apiserver did not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def admin(apiserver: ApiServer) -> Iterator[httpx.Client]:
    with apiserver.admin() as client:
        yield client
