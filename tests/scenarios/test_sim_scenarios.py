"""Each simulator scenario, driven by `vllm-sidecar loadtest`, produces its failure, and the sidecar's
derived gauges show the signal that precedes it. Real processes on loopback, bounded in time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.scenarios.harness import SimProcess, StatusWatch, loadtest_report, start_loadtest, start_sidecar

OOM = "torch.OutOfMemoryError: CUDA out of memory"


@pytest.fixture
def cleanup() -> Iterator[list[SimProcess | SidecarProcess]]:
    started: list[SimProcess | SidecarProcess] = []
    yield started
    for process in started:
        process.stop() if isinstance(process, SimProcess) else process.kill()


def _sim_and_sidecar(
    scenario: str, tmp_path: Path, cleanup: list[SimProcess | SidecarProcess], *overrides: str
) -> tuple[SimProcess, SidecarProcess, StatusWatch]:
    sim = SimProcess(scenario, tmp_path / "sim.log", *overrides)
    cleanup.append(sim)
    sim.wait_healthy()
    sidecar = start_sidecar(sim.url, tmp_path / "sidecar.log")
    cleanup.append(sidecar)
    return sim, sidecar, StatusWatch(sidecar.url)


def test_healthy_passes_a_peak_load(tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]) -> None:
    sim, _, watch = _sim_and_sidecar("healthy", tmp_path, cleanup)
    code, report = loadtest_report(
        start_loadtest(sim.url, "--concurrency", "32", "--prompt-tokens", "uniform:500-1500", "--duration", "8")
    )
    watch.stop()
    assert code == 0, report
    assert report["verdict"] in ("PASS", "WARN")
    assert report["server"]["died"] is False
    assert report["requests"]["failed"] == 0
    assert sim.process.poll() is None
    assert max(engine["kv_cache_usage_ratio"] for engine in watch.engines()) > 0


def test_burst_dies_of_cuda_oom_after_free_memory_falls_below_5_percent(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    sim, _, watch = _sim_and_sidecar("burst", tmp_path, cleanup)
    load = start_loadtest(
        sim.url,
        "--rate",
        "8",
        "--prompt-tokens",
        "2000",
        "--output-tokens",
        "256",
        "--duration",
        "40",
        "--timeout",
        "30",
    )
    assert sim.wait_exit(timeout_s=60) == 1
    code, report = loadtest_report(load)
    watch.stop()
    assert OOM in sim.log()
    assert "EngineDeadError" in sim.log()
    assert code == 1
    assert report["server"]["died"] is True
    assert sim.exited_at is not None
    warnings = [
        gpu
        for gpu in watch.gpus_before(sim.exited_at - 1.0)  # at least a second of warning
        if gpu["memory_free_bytes"] < 0.05 * gpu["memory_total_bytes"]
    ]
    assert warnings, "the sidecar never saw free GPU memory under 5 % before the crash"
    assert max(engine["kv_cache_usage_ratio"] for engine in watch.engines()) > 0.2


def test_leak_is_forecast_before_it_kills_vllm(tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]) -> None:
    # The preset leaking 1.5 times as fast: it dies after about 45 s instead of 67, still well after the 30 s of
    # memory points the trend needs before it forecasts.
    leak = ("--leak-bytes-per-s", str(48 * 2**20), "--leak-bytes-per-request", str(18 * 2**20))
    sim, _, watch = _sim_and_sidecar("leak", tmp_path, cleanup, *leak)
    load = start_loadtest(
        sim.url, "--concurrency", "32", "--prompt-tokens", "1000", "--output-tokens", "128", "--duration", "100"
    )
    assert sim.wait_exit(timeout_s=110) == 1
    load.kill()
    watch.stop()
    assert OOM in sim.log()
    assert sim.exited_at is not None
    forecasts = [gpu for gpu in watch.gpus_before(sim.exited_at) if gpu["time_to_oom_seconds"] is not None]
    assert forecasts, "the sidecar never forecast the OOM"
    first_forecast_at = next(t for t, doc in watch.samples if any(g["time_to_oom_seconds"] for g in doc["gpus"]))
    assert sim.exited_at - first_forecast_at > 5, "the forecast came too late to act on"
    assert all(gpu["memory_growth_bytes_per_second"] > 0 for gpu in forecasts)
    # The forecast points at the real death: within a factor of two of when it happened.
    t_forecast, document = next((t, d) for t, d in watch.samples if any(g["time_to_oom_seconds"] for g in d["gpus"]))
    predicted = document["gpus"][0]["time_to_oom_seconds"]
    actual = sim.exited_at - t_forecast
    assert 0.5 * actual < predicted < 2.0 * actual, (predicted, actual)


def test_tenant_memory_shows_as_another_process_over_the_budget(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    sim, _, watch = _sim_and_sidecar("tenant", tmp_path, cleanup)
    code, report = loadtest_report(start_loadtest(sim.url, "--concurrency", "16", "--duration", "12"))
    watch.stop()
    latest = watch.samples[-1][1]["gpus"][0]
    assert latest["other_process_memory_bytes"] >= 5 * 2**30
    assert latest["memory_over_budget_bytes"] > 0
    assert any(p["owner"] == "other" and p["name"] == "python train.py" for p in latest["processes"])
    assert any(p["owner"] == "vllm" for p in latest["processes"])
    assert report["server"]["died"] is False
    assert code == 0


def test_prefix_thrash_keeps_the_hit_ratio_low_despite_shared_prefixes(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    sim, sidecar, watch = _sim_and_sidecar("prefix-thrash", tmp_path, cleanup)
    load = start_loadtest(
        sim.url,
        *("--concurrency", "16", "--prompt-tokens", "1792", "--output-tokens", "32", "--duration", "15"),
        *("--shared-prefix-ratio", "1", "--shared-prefixes", "128", "--shared-prefix-tokens", "1536"),
    )
    loadtest_report(load)
    watch.stop()
    metrics = sidecar.get("/metrics").text
    (ratio_line,) = [line for line in metrics.splitlines() if line.startswith("vllm_sidecar_prefix_cache_hit_ratio{")]
    assert float(ratio_line.rsplit(" ", 1)[1]) < 0.3
    config = httpx.get(sim.url + "/metrics", timeout=5).text
    assert 'enable_prefix_caching="True"' in config


def test_hang_stalls_the_engine_while_health_stays_ok(
    tmp_path: Path, cleanup: list[SimProcess | SidecarProcess]
) -> None:
    # The engine hangs 1.5 s after the first request, while the first 16 are surely running: 400 tokens take
    # about 10 s. (With 128 tokens, about 3 s, and a hang at 3 s, CI saw the first 16 finish just before it:
    # /metrics froze at 0 running, which is the hang-idle wedge, not this one.) Requests give up after 10 s, so
    # those caught running stay running long enough for the stall to pass 5 s even when the sidecar's polls come
    # late (CI saw one run where they had all timed out first).
    sim, sidecar, watch = _sim_and_sidecar("hang", tmp_path, cleanup, "--hang-after-s", "1.5")
    load = start_loadtest(
        sim.url, "--concurrency", "16", "--duration", "14", "--timeout", "10", "--output-tokens", "400"
    )
    code, report = loadtest_report(load)
    watch.stop()
    stalled = [engine["engine_stalled_seconds"] for engine in watch.engines()]
    running = [engine["requests_running"] for engine in watch.engines()]
    # Seen once in CI under heavy load (every sample 0): say enough to tell a late load from a missed hang.
    assert max(stalled) > 5, f"running={running[::4]} report={report} sim log: {sim.log()[-1500:]}"
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 200
    assert "vllm_sidecar_vllm_healthy 1.0" in sidecar.get("/metrics").text
    assert report["requests"]["failed"] > 0  # requests time out on a hung engine
    assert code == 1


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
