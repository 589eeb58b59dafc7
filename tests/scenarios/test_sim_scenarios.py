"""The simulator as a process (`vllm-sidecar sim`) refusing to start the way vLLM does: its own message, then
nothing listening. What the sidecar sees of each scenario is tested on virtual time
(tests/scenarios/test_scenario_signals.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.scenarios.harness import SimProcess


def test_startup_refuses_with_vllms_own_message(tmp_path: Path) -> None:
    sim = SimProcess("startup", tmp_path / "sim.log")
    try:
        assert sim.wait_exit(timeout_s=30) == 1
    finally:
        sim.stop()
    log = sim.log()
    assert "ValueError: To serve at least one request with the model's max seq len (131072)" in log
    assert "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`" in log
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.url + "/health", timeout=1)


def test_startup_refusal_of_a_v0_server_uses_the_v0_wording(tmp_path: Path) -> None:
    sim = SimProcess("startup", tmp_path / "sim.log", "--vllm-version", "0.6")
    try:
        assert sim.wait_exit(timeout_s=30) == 1
    finally:
        sim.stop()
    assert (
        "The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache"
        in sim.log()
    )
