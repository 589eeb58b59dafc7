"""Smoke test of the real-vLLM harness: the server is up, and the standard load moves its metrics."""

from __future__ import annotations

import json
import urllib.request

import pytest

from .vllm.load import drive_standard_load, fetch_metrics, metric_labels
from .vllm.server import BLOCK_SIZE, MAX_NUM_SEQS, VllmServer

pytestmark = pytest.mark.e2e


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback test server)
        status: int = response.status
        return status, response.read()


def test_health_and_version(vllm_server: VllmServer) -> None:
    status, _ = _get(f"{vllm_server.base_url}/health")
    assert status == 200
    status, body = _get(f"{vllm_server.base_url}/version")
    assert status == 200
    assert json.loads(body)["version"] == "0.32.0"
    assert vllm_server.engine_core_pids(), "no EngineCore child process found"


def test_standard_load_moves_metrics(vllm_server: VllmServer) -> None:
    seen_full: list[dict[str, float]] = []
    peaks = {"vllm:kv_cache_usage_perc": 0.0, "vllm:num_requests_waiting": 0.0}

    def on_poll(values: dict[str, float]) -> None:
        if values.get("vllm:num_requests_running", 0.0) >= MAX_NUM_SEQS and not seen_full:
            seen_full.append(values)
        for name, peak in peaks.items():
            peaks[name] = max(peak, values.get(name, 0.0))

    def saw_everything() -> bool:
        # A round's peak is short; on a busy box a 0.25 s poller can miss it: rounds repeat (bounded) until seen.
        return bool(seen_full) and peaks["vllm:kv_cache_usage_perc"] > 0.5 and peaks["vllm:num_requests_waiting"] > 0

    report = drive_standard_load(vllm_server.base_url, on_poll=on_poll, until=saw_everything, max_phase_b_rounds=20)
    print(
        f"vLLM started in {vllm_server.startup_seconds:.1f} s; peaks: kv_cache_usage_perc "
        f"{report.peak_kv_cache_usage:.4f}, running {report.peak_running:g}, "
        f"waiting {report.peak_waiting:g}; "
        f"prefix cache hits/queries {report.prefix_cache_hits:g}/{report.prefix_cache_queries:g}; "
        f"preemptions {report.preemptions:g}; phase A {report.phase_a_seconds:.2f} s, phase B "
        f"{report.phase_b_seconds:.2f} s in {report.phase_b_rounds} round(s); {report.polls} polls"
    )

    assert report.peak_kv_cache_usage > 0.5
    assert report.peak_running == MAX_NUM_SEQS
    assert report.peak_waiting > 0
    assert report.prefix_cache_hits - report.prefix_cache_hits_before > 0
    assert report.prefix_cache_queries > report.prefix_cache_hits
    assert seen_full, "on_poll never saw the server at --max-num-seqs"
    assert all(c.completion_tokens == 300 for c in report.phase_b)

    config = metric_labels(fetch_metrics(vllm_server.base_url), "vllm:cache_config_info")
    assert len(config) == 1
    assert config[0]["num_gpu_blocks"] == "128"
    assert config[0]["block_size"] == str(BLOCK_SIZE)
