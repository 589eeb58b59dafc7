"""vLLM's own shedding and fault tolerance, through real processes on loopback: the simulator answers 503 above its
--max-num-queued-reqs and counts it; an engine its fault tolerance holds unhealthy takes the pod out of rotation."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.scenarios.harness import SimProcess, start_sidecar


@pytest.fixture
def cleanup() -> Iterator[list[SimProcess | SidecarProcess]]:
    started: list[SimProcess | SidecarProcess] = []
    yield started
    for process in started:
        process.stop() if isinstance(process, SimProcess) else process.kill()


def _complete(url: str, max_tokens: int) -> httpx.Response:
    body = {"model": "sim-llama", "prompt": "one two three four", "max_tokens": max_tokens}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def _metric(text: str, pattern: str) -> float | None:
    match = re.search(rf"^{pattern} (\S+)$", text, flags=re.MULTILINE)
    return float(match.group(1)) if match else None


def _until(check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s")


def first_done(futures: list[Future[httpx.Response]]) -> list[httpx.Response]:
    return [future.result(timeout=30) for future in futures]


def test_vllm_refusing_above_its_queue_cap_is_counted_and_exported(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    # 2 places, 5 requests of about 4 s each at once: 3 refused with vLLM's 503.
    sim = SimProcess("healthy", tmp_path / "sim.log", "--max-num-queued-reqs", "2", "--decode-step-s", "0.04")
    cleanup.append(sim)
    sim.wait_healthy()
    sidecar = start_sidecar(sim.url, tmp_path / "sidecar.log")
    cleanup.append(sidecar)
    with ThreadPoolExecutor(max_workers=5) as pool:
        first = [pool.submit(_complete, sim.url, 100) for _ in range(2)]
        _until(lambda: _metric(httpx.get(sim.url + "/metrics").text, r"vllm:num_requests_running\{[^}]*\}") == 2)
        refused = [_complete(sim.url, 100) for _ in range(3)]
        assert [response.status_code for response in first_done(first)] == [200, 200]
    assert [response.status_code for response in refused] == [503, 503, 503]
    assert "cannot accept new requests" in refused[0].json()["message"]
    raw = httpx.get(sim.url + "/metrics").text
    assert _metric(raw, r'vllm:admission_rejections_total\{model_name="sim-llama",reason="max_num_queued_reqs"\}') == 3

    def exported() -> bool:
        text = sidecar.get("/metrics").text
        return _metric(text, r'vllm_sidecar_vllm_rejections_in_window\{model_name="sim-llama"\}') == 3.0

    _until(exported)
    (model,) = sidecar.get("/status").json()["models"]
    assert model["admission_rejections_total"] == 3
    assert model["admission_rejections_by_reason"] == {"max_num_queued_reqs": 3, "max_num_queued_tokens": 0}


def test_an_engine_held_unhealthy_by_fault_tolerance_pauses_admission(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    # 16 MiB of activations per context token beyond the 256 the profile run saw: a 2,000-token prompt runs the
    # GPU out of memory within its first chunks.
    sim = SimProcess(
        "healthy",
        tmp_path / "sim.log",
        *("--enable-fault-tolerance", "true", "--engine-recovery-timeout-s", "60"),
        *("--activation-bytes-per-context-token", str(16 * 2**20), "--max-num-batched-tokens", "256"),
    )
    cleanup.append(sim)
    sim.wait_healthy()
    sidecar = start_sidecar(sim.url, tmp_path / "sidecar.log")
    cleanup.append(sidecar)
    _until(lambda: sidecar.get("/readyz").status_code == 200)
    assert _metric(sidecar.get("/metrics").text, r"vllm_sidecar_engine_unhealthy_seconds\{[^}]*\}") == 0.0
    prompt = " ".join(f"w{i}" for i in range(2000))
    dead = httpx.post(sim.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=30)
    assert dead.status_code == 500  # the request in flight when the engine died
    assert httpx.get(sim.url + "/health").status_code == 200  # fault tolerance: /health is liveness only
    assert _complete(sim.url, 4).status_code == 503
    assert _metric(httpx.get(sim.url + "/metrics").text, r'vllm:engine_healthy\{engine="0"\}') == 0.0
    _until(lambda: sidecar.get("/readyz").status_code == 503)
    text = sidecar.get("/metrics").text
    assert _metric(text, "vllm_sidecar_admission_paused") == 1.0
    unhealthy = _metric(text, r"vllm_sidecar_engine_unhealthy_seconds\{[^}]*\}")
    assert unhealthy is not None
    assert unhealthy >= 0.0
    assert "unhealthy" in sidecar.get("/readyz").text
