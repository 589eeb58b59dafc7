"""The sidecar reads the simulator process for every vLLM version profile, and data parallelism, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.scenarios.harness import SimProcess


def _once(url: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "once", "--json", "--vllm-url", url, "--gpu-source", "sim"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


@pytest.mark.parametrize(
    ("version", "served", "schema"), [("0.6", "0.6.6", "v0"), ("0.10", "0.10.2", "v1"), ("0.32", "0.32.0", "v1")]
)
def test_every_profile_is_read_by_the_sidecar(tmp_path: Path, version: str, served: str, schema: str) -> None:
    sim = SimProcess("healthy", tmp_path / "sim.log", "--vllm-version", version)
    try:
        sim.wait_healthy()
        document = _once(sim.url)
    finally:
        sim.stop()
    assert document["vllm"] == {
        "url": sim.url,
        "reachable": True,
        "healthy": True,
        "version": served,
        "metric_schema": schema,
    }
    (engine,) = document["engines"]
    assert engine["kv_cache_capacity_blocks"] == 27782  # 80 GiB x 0.9, less weights and activations, in 16-token blocks
    assert engine["kv_cache_block_size_tokens"] == 16
    (gpu,) = document["gpus"]
    assert gpu["memory_budget_bytes"] == int(80 * 2**30 * 0.9)
    assert document["problems"] == []


def test_data_parallel_engines_each_get_their_share(tmp_path: Path) -> None:
    sim = SimProcess("healthy", tmp_path / "sim.log", "--data-parallel", "2")
    try:
        sim.wait_healthy()
        document = _once(sim.url)
    finally:
        sim.stop()
    engines = document["engines"]
    assert [e["engine"] for e in engines] == ["0", "1"]
    # vLLM sums num_gpu_blocks over the engines of a server; the sidecar divides it back.
    assert [e["kv_cache_capacity_blocks"] for e in engines] == [27782, 27782]
    assert [g["gpu"] for g in document["gpus"]] == [0, 1]
