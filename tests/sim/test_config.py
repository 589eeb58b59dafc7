"""Settings validation and the scenario presets."""

from __future__ import annotations

import pytest

from sidecar.sim.config import KIB, SCENARIOS, Scenario, SimConfig, VllmVersion, scenario_config
from sidecar.sim.scenarios import LoadShape, scenario_load


def test_every_scenario_has_a_preset_and_a_load() -> None:
    assert SCENARIOS == (
        "healthy",
        "burst",
        "leak",
        "tenant",
        "prefix-thrash",
        "hang",
        "hang-queue",
        "hang-idle",
        "startup",
    )
    for name in SCENARIOS:
        config = scenario_config(name)
        assert config.scenario == Scenario(name)
        assert scenario_load(name).concurrency >= 1


def test_overrides_apply_on_top_of_the_preset() -> None:
    config = scenario_config("burst", vllm_version="0.10", data_parallel=2)
    assert config.vllm_version == VllmVersion.V0_10
    assert config.data_parallel == 2
    assert config.activation_bytes_per_context_token == 72 * KIB


def test_defaults_describe_an_8b_model_on_an_h100() -> None:
    config = SimConfig()
    assert (config.model_name, config.max_model_len, config.block_size) == ("sim-llama", 4096, 16)
    assert config.kv_bytes_per_token == 128 * KIB
    assert config.num_cpu_blocks is None
    assert SimConfig(vllm_version=VllmVersion.V0_6).num_cpu_blocks == 2048


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("nope", {}, "unknown scenario 'nope'"),
        ("healthy", {"colour": 1}, "unknown SimConfig field"),
        ("healthy", {"vllm_version": "0.7"}, "'0.7' is not a valid VllmVersion"),
        ("healthy", {"gpu_memory_utilization": 0.0}, "gpu_memory_utilization must be in"),
        ("healthy", {"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
        ("healthy", {"block_size": 0}, "block_size must be positive"),
        ("healthy", {"decode_step_s": 0.0}, "decode_step_s must be positive"),
        ("healthy", {"leak_bytes_per_s": -1.0}, "leak_bytes_per_s must not be negative"),
        ("healthy", {"hang_after_s": -1.0}, "hang_after_s must not be negative"),
        ("healthy", {"hang_queue_after_s": -1.0}, "hang_queue_after_s must not be negative"),
        ("healthy", {"hang_idle_after_s": -0.5}, "hang_idle_after_s must not be negative"),
        ("healthy", {"num_gpu_blocks": 1}, "num_gpu_blocks must be at least 2"),
        ("healthy", {"max_num_batched_tokens": 32}, "must be greater than or equal to max_num_seqs"),
        ("healthy", {"vllm_version": "0.6", "data_parallel": 2}, "no data parallelism"),
        ("healthy", {"model_name": ""}, "model_name must not be empty"),
    ],
)
def test_invalid_settings_are_refused_clearly(name: str, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scenario_config(name, **overrides)


def test_version_and_scenario_are_checked_when_built_directly() -> None:
    with pytest.raises(ValueError, match="vllm_version must be one of"):
        SimConfig(vllm_version="0.7")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scenario must be one of"):
        SimConfig(scenario="boom")  # type: ignore[arg-type]


def test_load_shape_ramps_linearly() -> None:
    shape = LoadShape(concurrency=64, concurrency_start=16, ramp_s=20.0)
    assert [shape.concurrency_at(t) for t in (0.0, 10.0, 20.0, 99.0)] == [16, 40, 64, 64]
    with pytest.raises(ValueError, match="unique suffix"):
        LoadShape(concurrency=1, prompt_tokens=100, prefix_tokens=100)


def test_load_shape_goes_quiet_for_its_spell() -> None:
    shape = LoadShape(concurrency=16, quiet_from_s=20.0, quiet_s=10.0)
    assert [shape.concurrency_at(t) for t in (0.0, 19.9, 20.0, 29.9, 30.0, 99.0)] == [16, 16, 0, 0, 16, 16]
    with pytest.raises(ValueError, match="must not be negative"):
        LoadShape(concurrency=1, quiet_from_s=1.0, quiet_s=-1.0)
