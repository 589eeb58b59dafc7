"""The doctor's live reading on a real GPU: another process holds part of the card (NVML lists it, /proc names
it), the simulator serves as vLLM with its budget of 0.9. Needs an NVIDIA GPU (skipped without one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from tests.gpu.oom_messages import GIB, holder_process
from tests.gpu.simulator import start_sim, wait_for

HELD_GIB = 60


def _sim_answers(url: str) -> bool:
    try:
        return httpx.get(url + "/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _doctor(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "doctor", "--vllm-url", url, "--gpu-source", "nvml", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_doctor_finds_nothing_to_change_on_a_healthy_card(
    torch_cuda: ModuleType, tmp_path: Path, record: dict[str, Any]
) -> None:
    del torch_cuda  # only its check
    sim, url, env = start_sim(tmp_path)
    try:
        wait_for(lambda: _sim_answers(url), 30, f"the simulator to answer at {url}")
        done = _doctor(url, env)
    finally:
        sim.kill()
        sim.wait()
    document = json.loads(done.stdout)
    record["exit"], record["document"] = done.returncode, document
    changes = [r for f in document["findings"] for r in f["recommendations"]]
    assert changes == [], document["findings"]
    assert done.returncode == 0, done.stderr[-2000:]


def test_doctor_bounds_the_budget_by_what_another_process_leaves(
    torch_cuda: ModuleType, tmp_path: Path, record: dict[str, Any]
) -> None:
    torch = torch_cuda
    total = torch.cuda.mem_get_info()[1]
    sim, url, env = start_sim(tmp_path)
    holder = holder_process(HELD_GIB)
    try:
        wait_for(lambda: _sim_answers(url), 30, f"the simulator to answer at {url}")
        done = _doctor(url, env)
    finally:
        for process in (holder, sim):
            process.kill()
            process.wait()
    record["exit"] = done.returncode
    record["stderr"] = done.stderr[-4000:]
    document = json.loads(done.stdout)
    record["document"] = document
    assert done.returncode == 1, done.stderr[-2000:]
    (finding,) = [f for f in document["findings"] if f["cause"] == "configuration_overshoot"]
    assert any(f"pid {holder.pid}" in line for line in finding["evidence"]), finding["evidence"]
    (budget,) = [r["value"] for r in finding["recommendations"] if r["flag"] == "--gpu-memory-utilization"]
    left = (total - HELD_GIB * GIB) / total
    assert 0.1 <= budget <= left - 0.05 + 0.01  # vLLM's 5 % reserve, rounded down to hundredths
