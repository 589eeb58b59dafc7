"""The daemon on a real GPU: NVML for the card, the allocator probe for a CUDA process that fragments its
allocator (the plugin loaded as vLLM loads it), the simulator as vLLM. Needs an NVIDIA GPU (skipped without one)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from tests.adapters.daemon_process import SidecarProcess
from tests.gpu.simulator import REPO, start_sim, wait_for


def _sample(metrics: str, name: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_daemon_exports_nvml_and_the_allocator_probe(
    torch_cuda: ModuleType, tmp_path: Path, record: dict[str, Any]
) -> None:
    del torch_cuda  # only its check: the workload is a process of its own
    probe_dir = tmp_path / "probe"
    sim, sim_url, env = start_sim(tmp_path, VLLM_SIDECAR_PROBE_DIR=str(probe_dir), VLLM_SIDECAR_PROBE_INTERVAL="0.5")
    sidecar = SidecarProcess(
        [f"--vllm-url={sim_url}", "--gpu-source=nvml", f"--probe-dir={probe_dir}", "--interval=0.5"],
        tmp_path / "sidecar.log",
    )
    workload = subprocess.Popen(
        [sys.executable, "-m", "tests.gpu.fragment", "3", "4"],  # seed 3; fragments 4 s after it starts sampling
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "workload.log").open("w"),
        env=env,
        text=True,
        cwd=REPO,
    )
    try:
        sidecar.wait_ready(timeout_s=30)
        assert workload.stdout is not None
        phases = []
        while (line := workload.stdout.readline().strip()) != "holding":
            assert line, f"the workload ended early: {(tmp_path / 'workload.log').read_text()[-2000:]}"
            phases.append(line)
        record["phases"] = phases

        # The retries rose while the sidecar watched: it pauses admission, with the allocator's numbers.
        def paused_for_the_allocator() -> str | None:
            answer = sidecar.get("/readyz")
            return answer.text if answer.status_code == 503 and "allocator" in answer.text else None

        paused = wait_for(paused_for_the_allocator, 10, "/readyz 503 for the allocator's retries")
        record["readyz_paused"] = paused
        assert "PyTorch's allocator retried" in paused
        assert "on GPU 0" in paused

        def exported() -> str | None:
            metrics = sidecar.get("/metrics").text
            ready = _sample(metrics, 'vllm_sidecar_source_success{source="probe"}') == 1.0
            return metrics if ready and "vllm_sidecar_gpu_memory_total_bytes{" in metrics else None

        metrics = wait_for(exported, 20, "the probe and NVML exported")
        record["metrics"] = [line for line in metrics.splitlines() if "torch" in line or "gpu_memory" in line]
        assert _sample(metrics, 'vllm_sidecar_source_success{source="nvml"}') == 1.0
        retries = _sample(metrics, 'vllm_sidecar_torch_alloc_retries_total{gpu="0",rank="none"}')
        assert retries is not None
        assert retries >= 1
        ratio = _sample(metrics, 'vllm_sidecar_torch_fragmentation_ratio{gpu="0",rank="none"}')
        assert ratio is not None
        assert 0 < ratio < 1
        assert (_sample(metrics, 'vllm_sidecar_torch_ooms_total{gpu="0",rank="none"}') or 0) >= 1
        status = httpx.get(sidecar.url + "/status", timeout=5).json()
        record["status_allocators"] = status["allocators"]
        assert status["sources"]["probe"]["ok"] is True

        # A process killed without its exit handler leaves its file; once stale and its pid gone, it is removed.
        (probe_file,) = probe_dir.glob("*.json")
        workload.send_signal(signal.SIGKILL)
        workload.wait()
        wait_for(lambda: not probe_file.exists(), 10, f"{probe_file} removed")
        after = wait_for(
            lambda: (
                sidecar.get("/metrics").text
                if _sample(sidecar.get("/metrics").text, 'vllm_sidecar_source_success{source="probe"}') == 0.0
                else None
            ),
            10,
            "the probe failing once no process samples",
        )
        assert _sample(after, "vllm_sidecar_torch_reserved_bytes{") is None
    finally:
        for process in (workload, sim):
            if process.poll() is None:
                process.kill()
                process.wait()
        sidecar.kill()
