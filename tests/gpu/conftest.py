"""Tests that need a real NVIDIA GPU: the allocator probe inside a CUDA process, NVML against a real driver, the
daemon with both. CI has no GPU, so there they are skipped with the reason; they are run on a GPU machine with
`python -m pytest tests/gpu` (the figures of the last such run are in docs/gpu-runs.md).

Set GPU_RESULTS_DIR to keep each test's measurements as JSON there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="session")
def torch_cuda() -> ModuleType:
    try:
        import torch
    except ImportError:
        pytest.skip("needs torch with CUDA and an NVIDIA GPU (none here)")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (torch sees none here)")
    module: ModuleType = torch
    return module


@pytest.fixture
def record() -> Iterator[dict[str, Any]]:
    """Measurements a test wants kept: written to GPU_RESULTS_DIR/<test>.json when that is set."""
    figures: dict[str, Any] = {}
    yield figures
    folder = os.environ.get("GPU_RESULTS_DIR")
    if folder and figures:
        name = os.environ.get("PYTEST_CURRENT_TEST", "test").split("::")[-1].split(" ")[0]
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(figures, indent=1, default=str))
