"""Each scenario under its calibrated load: the failure happens, and the signal a sidecar needs comes first."""

from __future__ import annotations

from sidecar.sim.config import GIB, VllmVersion, scenario_config
from sidecar.sim.scenarios import scenario_load
from sidecar.sim.simulation import EngineDeadError, Simulation
from tests.sim.driver import ListRecorder, Run, Sample, drive

WARNING_FREE_RATIO = 0.05


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope and r^2, computed here so the test shares nothing with the sidecar's own fit."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    s_tt = sum((t - mean_t) ** 2 for t, _ in points)
    s_tv = sum((t - mean_t) * (v - mean_v) for t, v in points)
    s_vv = sum((v - mean_v) ** 2 for _, v in points)
    return s_tv / s_tt, s_tv * s_tv / (s_tt * s_vv)


def scenario_run(name: str, until_s: float, **overrides: object) -> Run:
    return drive(scenario_config(name, **overrides), scenario_load(name), until_s=until_s)


def test_healthy_serves_a_minute_without_trouble() -> None:
    run = scenario_run("healthy", 60.0)
    assert run.death is None
    assert run.hung_s is None
    assert min(s.free_ratio for s in run.samples) > 0.09
    assert run.recorder.total("preemptions") == 0
    assert len(run.recorder.finished) > 300
    assert max(s.running for s in run.samples) == 32


def test_burst_dies_of_a_cuda_oom_after_free_memory_fell_below_5_percent() -> None:
    run = scenario_run("burst", 60.0)
    assert run.death is not None
    assert run.death_s is not None
    assert 10.0 < run.death_s < 40.0
    warning = next(s for s in run.samples if s.free_ratio < WARNING_FREE_RATIO)
    assert run.death_s - warning.t >= 5.0, "the signal leaves time to act"
    first_busy = next(s for s in run.samples if s.running > 0)
    assert warning.running > first_busy.running, "running requests climb towards the failure"
    assert run.samples[-1].kv_usage > warning.kv_usage > first_busy.kv_usage
    assert 25 <= warning.running <= 45
    assert run.samples[-1].running >= 55
    assert any("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in line for line in run.death.log_lines)
    assert run.death.log_lines[-1].endswith("See stack trace (above) for the root cause.")


def test_burst_survives_when_the_load_stops_at_the_warning() -> None:
    config, shape = scenario_config("burst"), scenario_load("burst")

    def warned(sample: Sample) -> bool:
        return sample.free_ratio < WARNING_FREE_RATIO

    run = drive(config, shape, until_s=60.0, stop_load=warned)
    assert run.death is None
    assert any(warned(s) for s in run.samples)
    assert run.samples[-1].running == 0, "every request in flight at the warning completed"
    assert all(s.free_bytes > 0 for s in run.samples)


def test_leak_grows_steadily_enough_to_forecast_then_dies() -> None:
    run = scenario_run("leak", 120.0)
    assert run.death is not None
    assert run.death_s is not None
    assert 40.0 < run.death_s < 80.0
    window = [(s.t, float(s.used_bytes)) for s in run.samples if 5.0 <= s.t <= 35.0]
    slope, r2 = fit(window)
    assert 100 * 1024**2 < slope < 300 * 1024**2, "about 150-200 MiB/s"
    assert r2 > 0.95
    at = next(s for s in run.samples if s.t >= 35.0)
    forecast_s = (at.total_bytes - at.used_bytes) / slope
    actual_s = run.death_s - at.t
    assert 0.7 < forecast_s / actual_s < 1.4
    assert any("Tried to allocate" in line for line in run.death.log_lines)


def test_a_tenant_pushes_used_memory_over_vllms_budget() -> None:
    config = scenario_config("tenant")
    run = drive(config, scenario_load("tenant"), until_s=30.0)
    assert run.death is None
    assert all(s.tenant_bytes == 0 for s in run.samples if s.t < 5.0)
    late = [s for s in run.samples if s.t >= 15.0]
    assert all(s.tenant_bytes == 6 * GIB for s in late)
    assert all(s.used_bytes - config.budget_bytes >= 5 * GIB for s in late)
    assert all(s.free_ratio < WARNING_FREE_RATIO for s in late)
    names = [p.name for p in run.sim.gpu_states(30.0)[0].processes]
    assert names == ["VLLM::EngineCore", "python train.py"]


def test_prefix_thrash_keeps_the_hit_ratio_low_although_prefixes_are_shared() -> None:
    shape = scenario_load("prefix-thrash")
    run = scenario_run("prefix-thrash", 40.0)
    assert run.death is None
    assert len(run.recorder.finished) > 3 * shape.prefix_groups, "each prefix is reused several times"
    assert run.recorder.hit_ratio() < 0.3
    # The same requests on a cache big enough for the working set hit most of the time.
    roomy = drive(scenario_config("healthy"), shape, until_s=40.0)
    assert roomy.recorder.hit_ratio() > 0.6


def test_hang_freezes_progress_while_requests_stay_in_flight() -> None:
    run = scenario_run("hang", 30.0)
    assert run.hung_s is not None
    assert 10.0 <= run.hung_s < 10.5
    frozen = [s for s in run.samples if s.t > run.hung_s]
    assert len(frozen) > 10
    assert len({(s.generation_tokens, s.finished) for s in frozen}) == 1, "counters frozen"
    assert all(s.running > 0 for s in frozen)
    steps_at_hang = len(run.recorder.steps)
    outcome = run.sim.step(31.0)
    assert outcome.hung
    assert outcome.tokens == ()
    assert len(run.recorder.steps) == steps_at_hang
    assert run.sim.gpu_states(31.0)[0].utilization_ratio == 1.0
    assert not run.sim.abort("cmpl-sim-0-1", 31.0), "a hung engine processes no abort"


def test_startup_refuses_with_vllms_exact_message() -> None:
    v06 = Simulation(scenario_config("startup", vllm_version="0.6"), ListRecorder()).startup_check()
    assert v06 is not None
    assert v06[-1] == (
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored "
        "in KV cache (51296). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )
    expected = (
        "ValueError: To serve at least one request with the {model} max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (6.26 GiB). Based on the available memory, the "
        "estimated maximum model length is 51296. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )
    for version, model in (("0.10", "models's"), ("0.32", "model's")):
        sim = Simulation(scenario_config("startup", vllm_version=version), ListRecorder())
        lines = sim.startup_check()
        assert lines is not None
        assert any(line.endswith("] " + expected.format(model=model)) for line in lines)
        assert lines[-1].endswith("RuntimeError: Engine core initialization failed. See root cause above. "
                                  "Failed core proc(s): {}")  # fmt: skip
        assert sim.startup_log() == lines
        try:
            sim.add_request("r", [1, 2, 3], 4, 0.0)
        except EngineDeadError:
            pass
        else:
            raise AssertionError("a refused engine accepted a request")


def test_no_memory_left_for_the_cache_at_all() -> None:
    sim = Simulation(scenario_config("startup", gpu_memory_utilization=0.2), ListRecorder())
    lines = sim.startup_check()
    assert lines is not None
    assert lines[-2].endswith(
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine."
    )


def test_other_scenarios_start() -> None:
    for name in ("healthy", "burst", "leak", "tenant", "prefix-thrash", "hang", "hang-queue", "hang-idle"):
        for version in VllmVersion:
            assert Simulation(scenario_config(name, vllm_version=version), ListRecorder()).startup_check() is None


def test_a_run_is_deterministic_for_a_seed() -> None:
    first = scenario_run("burst", 60.0)
    second = scenario_run("burst", 60.0)
    assert first.samples == second.samples
    assert first.death == second.death
    assert first.recorder.steps == second.recorder.steps
    other_seed = drive(scenario_config("burst", seed=7), scenario_load("burst"), until_s=5.0, seed=7)
    assert [s.used_bytes for s in other_seed.samples] != [s.used_bytes for s in first.samples[:6]]
