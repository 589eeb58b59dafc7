"""vLLM's own shedding and fault tolerance in the simulator: --max-num-queued-reqs answers 503 and counts the
rejection, --enable-fault-tolerance shows vllm:engine_healthy; the settings only exist on the newest profile."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.sim.config import SimConfig, VllmVersion, scenario_config
from sidecar.sim.exposition import CacheSettings, MetricsWriter
from sidecar.sim.records import EngineGauges
from sidecar.sim.simulation import QueueOverflowError, Simulation
from tests.sim.driver import ListRecorder

CACHE = CacheSettings(max_model_len=4096, num_gpu_blocks_per_engine=1000, block_size=16)


def _gauges(engines: int) -> list[EngineGauges]:
    return [
        EngineGauges(
            engine=engine,
            running=1,
            waiting=3,
            waiting_deferred=1,
            kv_usage_ratio=0.1,
            num_gpu_blocks=1000,
            block_size=16,
            num_cpu_blocks=None,
        )
        for engine in range(engines)
    ]


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_the_queue_cap_counts_waiting_and_running_across_engines_and_n() -> None:
    sim = Simulation(SimConfig(max_num_queued_reqs=3, data_parallel=2), ListRecorder())
    sim.add_request("a", [1, 2, 3], 8, 0.0)
    sim.add_request("b", [1, 2, 3], 8, 0.0, n=2)  # n = 2 takes two places, as vLLM counts it
    assert sim.in_flight == 3
    with pytest.raises(QueueOverflowError, match="cannot accept new requests"):
        sim.add_request("c", [1, 2, 3], 8, 0.0)
    sim.abort("a", 0.1)
    sim.add_request("c", [1, 2, 3], 8, 0.2)  # a place freed
    assert QueueOverflowError.reason == "max_num_queued_reqs"


def test_no_cap_by_default() -> None:
    sim = Simulation(SimConfig(), ListRecorder())
    for i in range(200):
        sim.add_request(f"r{i}", [1, 2, 3], 8, 0.0)
    assert sim.in_flight == 200


def test_rejections_are_counted_per_reason_without_an_engine_label() -> None:
    writer = MetricsWriter("0.32", model_name="sim/tiny", cache=CACHE, engines=2)
    writer.admission_rejected("max_num_queued_reqs")
    writer.admission_rejected("max_num_queued_reqs")
    text = writer.render(_gauges(2), now_s=0.0).decode()
    assert _samples(text, "vllm:admission_rejections_total") == {
        (("model_name", "sim/tiny"), ("reason", "max_num_queued_reqs")): 2.0,
        (("model_name", "sim/tiny"), ("reason", "max_num_queued_tokens")): 0.0,
    }


def test_waiting_by_reason_adds_up_to_waiting() -> None:
    text = MetricsWriter("0.32", model_name="m", cache=CACHE).render(_gauges(1), now_s=0.0).decode()
    by_reason = _samples(text, "vllm:num_requests_waiting_by_reason")
    assert sum(by_reason.values()) == next(iter(_samples(text, "vllm:num_requests_waiting").values())) == 3
    assert by_reason[(("engine", "0"), ("model_name", "m"), ("reason", "deferred"))] == 1


def test_engine_healthy_only_with_fault_tolerance_labelled_by_engine_alone() -> None:
    plain = MetricsWriter("0.32", model_name="m", cache=CACHE, engines=2).render(_gauges(2), now_s=0.0).decode()
    assert "vllm:engine_healthy" not in plain
    writer = MetricsWriter("0.32", model_name="m", cache=CACHE, engines=2, fault_tolerance=True)
    text = writer.render(_gauges(2), now_s=0.0).decode()
    assert _samples(text, "vllm:engine_healthy") == {(("engine", "0"),): 1.0, (("engine", "1"),): 1.0}
    families = [family.name for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")]
    assert families[-1] == "vllm:engine_healthy", "collected after every engine metric, as vLLM registers it"
    writer.engine_health(1, healthy=False)
    text = writer.render(_gauges(2), now_s=0.0).decode()
    assert _samples(text, "vllm:engine_healthy") == {(("engine", "0"),): 1.0, (("engine", "1"),): 0.0}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vllm_version": "0.10", "max_num_queued_reqs": 4}, "no --max-num-queued-reqs"),
        ({"vllm_version": "0.6", "enable_fault_tolerance": True}, "no --enable-fault-tolerance"),
        ({"max_num_queued_reqs": -1}, "max_num_queued_reqs must not be negative"),
        ({"engine_recovery_timeout_s": -1.0}, "engine_recovery_timeout_s must not be negative"),
    ],
)
def test_settings_a_version_does_not_have_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scenario_config("healthy", **overrides)


def test_the_writer_refuses_fault_tolerance_on_old_profiles() -> None:
    with pytest.raises(ValueError, match="no --enable-fault-tolerance"):
        MetricsWriter("0.10", model_name="m", cache=CACHE, fault_tolerance=True)
    assert SimConfig(enable_fault_tolerance=True).vllm_version is VllmVersion.V0_32
