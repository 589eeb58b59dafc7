"""The simulation as the server drives it: routing, startup lines, gauges, GPUs, death and what follows it."""

from __future__ import annotations

import pytest

from sidecar.sim.config import SimConfig, VllmVersion, scenario_config
from sidecar.sim.engine import RequestRejectedError
from sidecar.sim.records import DeathCause, FinishReason
from sidecar.sim.simulation import EngineDeadError, Simulation
from tests.sim.driver import ListRecorder


def simulation(config: SimConfig) -> tuple[Simulation, ListRecorder]:
    recorder = ListRecorder()
    return Simulation(config, recorder), recorder


def test_data_parallel_routes_to_the_least_loaded_engine() -> None:
    sim, recorder = simulation(scenario_config("healthy", data_parallel=2))
    engines = [sim.add_request(f"r{i}", list(range(i, i + 100)), 5, 0.0) for i in range(4)]
    assert engines == [0, 1, 0, 1]
    now = 0.0
    while sim.has_work:
        now += sim.step(now).duration_s
    assert {r.engine for r in recorder.finished} == {0, 1}
    assert [g.engine for g in sim.engine_gauges()] == [0, 1]
    gpus = sim.gpu_states(now)
    assert [g.index for g in gpus] == [0, 1]
    assert [g.processes[0].name for g in gpus] == ["VLLM::EngineCore_DP0", "VLLM::EngineCore_DP1"]
    assert [g.processes[0].pid for g in gpus] == [4242, 4243]
    assert gpus[0].uuid != gpus[1].uuid


def test_startup_log_states_the_kv_capacity_per_version() -> None:
    v032 = Simulation(SimConfig(), ListRecorder()).startup_log(now_s=0.0)
    assert any(
        line.endswith("GPU KV cache size: 444,512 tokens, Maximum concurrency for 4,096 tokens per request: 108.52x")
        for line in v032
    )
    assert any(line.endswith("Available KV cache memory: 54.26 GiB") for line in v032)
    v010 = Simulation(SimConfig(vllm_version=VllmVersion.V0_10), ListRecorder()).startup_log()
    assert any(line.endswith("] GPU KV cache size: 444,512 tokens") for line in v010)
    assert any(line.endswith("] Maximum concurrency for 4,096 tokens per request: 108.52x") for line in v010)
    v06 = Simulation(SimConfig(vllm_version=VllmVersion.V0_6), ListRecorder()).startup_log()
    assert v06[0].endswith("gpu_executor.py:122] # GPU blocks: 27782, # CPU blocks: 2048")
    assert v06[1].endswith("] Maximum concurrency for 4096 tokens per request: 108.52x")
    dp = Simulation(SimConfig(data_parallel=2), ListRecorder()).startup_log()
    assert sum("num_gpu_blocks is: 55564" in line for line in dp) == 2, "the frontend sums the engines' blocks"


def test_kv_usage_gauge_follows_the_version() -> None:
    config = SimConfig(num_gpu_blocks=128, max_model_len=1024, vllm_version=VllmVersion.V0_10)
    sim, _ = simulation(config)
    # 0.10.2 leaves the null block out, as every release since (0.8.3-0.10.1.1 read 1 / 128 when idle).
    assert sim.engine_gauges()[0].kv_usage_ratio == 0.0
    sim, _ = simulation(SimConfig(num_gpu_blocks=128, max_model_len=1024))
    sim.add_request("r", list(range(64)), 10, 0.0)
    sim.step(0.0)
    assert sim.engine_gauges()[0].kv_usage_ratio == 4 / 127


def test_rejections_and_duplicates() -> None:
    sim, _ = simulation(SimConfig())
    with pytest.raises(RequestRejectedError, match="maximum context length is 4096 tokens"):
        sim.add_request("r", [1] * 4000, 100, 0.0)
    sim.add_request("r", [1] * 10, 10, 0.0)
    with pytest.raises(ValueError, match="already running"):
        sim.add_request("r", [1] * 10, 10, 0.0)


def test_abort_through_the_simulation() -> None:
    sim, recorder = simulation(SimConfig())
    sim.add_request("r", list(range(50)), 100, 0.0)
    sim.step(0.0)
    assert sim.abort("r", 0.1)
    assert not sim.abort("r", 0.2)
    assert recorder.finished[0].finish_reason == FinishReason.ABORT
    assert not sim.has_work


def test_a_death_is_reported_once_and_the_engine_stays_dead() -> None:
    config = scenario_config("healthy", activation_bytes_per_context_token=4 * 1024 * 1024)
    sim, recorder = simulation(config)
    for i in range(8):
        sim.add_request(f"r{i}", list(range(i * 3000, i * 3000 + 2000)), 50, 0.0)
    now = 0.0
    for _ in range(100):
        outcome = sim.step(now)
        if outcome.death is not None:
            break
        now += outcome.duration_s
    death = outcome.death
    assert death is not None
    assert death.cause == DeathCause.CUDA_OOM
    assert death.engine == 0
    assert sim.death == death
    assert not sim.alive
    assert outcome.tokens == ()
    steps = len(recorder.steps)
    after = sim.step(now + 1.0)
    assert after.death is None
    assert len(recorder.steps) == steps
    with pytest.raises(EngineDeadError):
        sim.add_request("late", [1, 2, 3], 3, now + 1.0)
    assert sim.gpu_states(now + 1.0)[0].utilization_ratio == 0.0


def test_v06_burst_dies_with_v0_lines() -> None:
    config = scenario_config("burst", vllm_version="0.6", activation_bytes_per_context_token=1024 * 1024)
    sim, _ = simulation(config)
    for i in range(16):
        sim.add_request(f"r{i}", list(range(i * 3000, i * 3000 + 2000)), 50, 0.0)
    now = 0.0
    death = None
    while death is None and now < 60.0:
        outcome = sim.step(now)
        death = outcome.death
        now += outcome.duration_s
    assert death is not None
    assert "engine.py:135] OutOfMemoryError('CUDA out of memory." in death.log_lines[0]
    assert death.log_lines[-1].endswith("MQLLMEngine is already dead, terminating server process")


def test_tenant_appears_even_without_load() -> None:
    sim, _ = simulation(scenario_config("tenant"))
    assert len(sim.gpu_states(100.0)[0].processes) == 1, "the clock starts at the first call"
    assert len(sim.gpu_states(104.0)[0].processes) == 1
    tenant = sim.gpu_states(106.0)[0].processes[1]
    assert (tenant.pid, tenant.name) == (31337, "python train.py")
    assert tenant.used_bytes == 500 * 1024 * 1024 + 1024**3
