"""The vLLM reader on every recorded exposition, against values written down independently per file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.derive.kv import derive_kv
from sidecar.model.vllm import MetricSchema, VllmReading
from sidecar.parse.exposition import parse_exposition
from sidecar.parse.vllm import KEPT_SAMPLES, detect_schema, read_vllm, vllm_sample_picker
from tests.conftest import EXPOSITIONS, exposition_files

SCHEMA_BY_FILE = {
    "vllm-0.5.4-v0.prom": MetricSchema.V0,
    "vllm-0.6.3-v0-prefix-disabled.prom": MetricSchema.V0,
    "vllm-0.6.6-v0-prefix-enabled.prom": MetricSchema.V0,
    "vllm-0.8.1-v1.prom": MetricSchema.V1_LEGACY,
    "vllm-0.8.5-v1.prom": MetricSchema.V1_LEGACY,
    "vllm-0.10.2-v1.prom": MetricSchema.V1,
    "vllm-0.11.0-v1-api-server-2.prom": MetricSchema.V1,
    "vllm-0.32.0-cpu-under-load.prom": MetricSchema.V1,
    "vllm-0.32.0-cpu-after-load.prom": MetricSchema.V1,
    "vllm-0.32.0-dp2.prom": MetricSchema.V1,
    "vllm-0.32.0-unknown-families.prom": MetricSchema.V1,
    "vllm-0.32.0-disable-log-stats.prom": MetricSchema.NO_VLLM_METRICS,
}


def _expected(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.with_name(path.stem + ".expected.json").read_text())
    return document


def test_every_recorded_exposition_has_a_schema_and_expectations() -> None:
    files = {path.name for path in exposition_files()}
    assert files == set(SCHEMA_BY_FILE)
    for path in exposition_files():
        assert path.with_name(path.stem + ".expected.json").exists(), path.name


@pytest.mark.parametrize("parse", ["strict", "pick"])  # the doctor's parse, the daemon's
@pytest.mark.parametrize("path", exposition_files(), ids=lambda path: path.name)
def test_reader_matches_independent_expectations(path: Path, parse: str) -> None:
    expected = _expected(path)
    text = path.read_text()
    exposition = parse_exposition(text, KEPT_SAMPLES) if parse == "strict" else vllm_sample_picker().pick(text)
    assert detect_schema(exposition) is SCHEMA_BY_FILE[path.name]
    reading = read_vllm(exposition, url="http://vllm", version=expected["vllm_version"])
    assert len(reading.engines) == expected["engine_count"]
    for engine, want in zip(reading.engines, expected["engines"], strict=True):
        assert (engine.model_name, engine.engine) == (want["model_name"], want["engine"])
        usage = want["kv_cache_usage_ratio"]
        # The pid quirk (0.9.2-0.11 with --api-server-count > 1): one value per process; the highest is kept.
        assert engine.kv_cache_usage_ratio == (max(usage.values()) if isinstance(usage, dict) else usage)
        assert engine.requests_running == want["requests_running"]
        assert engine.requests_waiting == want["requests_waiting"]
        config = engine.cache_config
        assert config is not None
        assert config.num_gpu_blocks_server == want["num_gpu_blocks"]
        assert config.block_size_tokens == want["block_size"]
        assert config.gpu_memory_utilization == want["gpu_memory_utilization"]
        assert config.enable_prefix_caching == want["enable_prefix_caching"]
        assert engine.prefix_cache_queries_total == want["prefix_cache_queries_total"]
        assert engine.prefix_cache_hits_total == want["prefix_cache_hits_total"]
        assert engine.prefix_cache_hit_rate_gauge == want["prefix_cache_hit_rate_gauge"]
        assert engine.preemptions_total == want["preemptions_total"]
        assert engine.prompt_tokens_total == want["prompt_tokens_total"]
        assert engine.generation_tokens_total == want["generation_tokens_total"]
        assert engine.iterations_total == want["iteration_tokens_count"]
        if "num_gpu_blocks_per_engine" in want:
            assert derive_kv(engine).capacity_blocks == want["num_gpu_blocks_per_engine"]
        if "kv_cache_size_tokens" in want:
            assert config.kv_cache_size_tokens == want["kv_cache_size_tokens"]
        assert engine.requests_waiting_capacity == want["requests_waiting_capacity"]
        assert engine.requests_waiting_deferred == want["requests_waiting_deferred"]
        assert engine.engine_healthy == want["engine_healthy"]
    rejections = {model.model_name: dict(model.admission_rejections_by_reason) for model in reading.models}
    assert rejections == expected["admission_rejections"]


def test_disable_log_stats_is_a_problem_with_no_engines() -> None:
    text = (EXPOSITIONS / "vllm-0.32.0-disable-log-stats.prom").read_text()
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version="0.32.0")
    assert reading.engines == ()
    assert reading.problems == (
        "vLLM /metrics has no vllm: metric family (is vLLM started with --disable-log-stats?): "
        "nothing about the engine can be derived",
    )


def test_num_gpu_blocks_none_is_reported() -> None:
    text = (EXPOSITIONS / "vllm-0.8.5-v1.prom").read_text()
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version="0.8.5")
    assert any("num_gpu_blocks=None" in problem for problem in reading.problems)
    assert derive_kv(reading.engines[0]).capacity_blocks is None


def test_no_cache_config_is_reported() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
    )
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version=None)
    assert reading.engines[0].cache_config is None
    assert reading.problems == (
        "vLLM /metrics has no vllm:cache_config_info: KV-cache capacity and block size unknown",
    )


def test_unrecognised_vllm_exposition() -> None:
    reading = read_vllm(parse_exposition("vllm:something_new 1\n", KEPT_SAMPLES), url="u", version=None)
    assert reading.schema is MetricSchema.UNRECOGNISED
    assert "KV-cache usage unknown" in reading.problems[0]


def test_a_non_numeric_cache_label_is_a_problem_not_a_crash() -> None:
    text = (
        'vllm:cache_config_info{block_size="sixteen",engine="0",num_gpu_blocks="128"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version=None)
    config = reading.engines[0].cache_config
    assert config is not None
    assert (config.block_size_tokens, config.num_gpu_blocks_server) == (None, 128)
    assert "label block_size='sixteen' is not a number" in reading.problems[0]


def test_a_cache_label_too_large_to_be_a_size_is_a_problem_not_an_overflow() -> None:
    """block_size="1e308" as an int times 16 blocks is no float: /metrics' export of the capacity raised."""
    text = (
        'vllm:cache_config_info{block_size="1e308",engine="0",num_gpu_blocks="16"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version=None)
    config = reading.engines[0].cache_config
    assert config is not None
    assert (config.block_size_tokens, config.num_gpu_blocks_server) == (None, 16)
    assert "label block_size='1e308' is too large to be a size; ignored" in reading.problems[0]
    assert derive_kv(reading.engines[0]).capacity_tokens is None


def test_nan_from_vllm_is_unknown_not_a_number() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
    )
    (engine,) = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version=None).engines
    assert engine.kv_cache_usage_ratio is None
    assert engine.requests_running == 2.0


def _read(text: str, parse: str) -> VllmReading:
    exposition = parse_exposition(text, KEPT_SAMPLES) if parse == "strict" else vllm_sample_picker().pick(text)
    return read_vllm(exposition, url="u", version="0.34.0")


# vLLM main after 0.33.0 with --enable-fault-tolerance and --max-num-queued-reqs, two data-parallel engines, engine 1
# faulted: the label sets of vllm/entrypoints/serve/instrumentator/metrics.py (`_EngineHealthCollector`: engine
# only, no model_name, no _created) and vllm/v1/metrics/loggers.py (admission_rejections: model_name and reason).
FAULT_TOLERANT_DP2 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_running{engine="1",model_name="m"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 5.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 2.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="capacity"} 0.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="deferred"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.0
# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.
# TYPE vllm:admission_rejections_total counter
vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 41.0
vllm:admission_rejections_total{model_name="m",reason="max_num_queued_tokens"} 1.0
# HELP vllm:admission_rejections_created Number of admission attempts rejected by a queue limit, by reason.
# TYPE vllm:admission_rejections_created gauge
vllm:admission_rejections_created{model_name="m",reason="max_num_queued_reqs"} 1.7956000048503942e+09
vllm:admission_rejections_created{model_name="m",reason="max_num_queued_tokens"} 1.7956000048504179e+09
# HELP vllm:engine_healthy Whether the engine reports healthy under fault tolerance.
# TYPE vllm:engine_healthy gauge
vllm:engine_healthy{engine="0"} 1.0
vllm:engine_healthy{engine="1"} 0.0
"""


@pytest.mark.parametrize("parse", ["strict", "pick"])
def test_fault_tolerance_queue_reasons_and_rejections(parse: str) -> None:
    reading = _read(FAULT_TOLERANT_DP2, parse)
    first, second = reading.engines
    assert (first.requests_waiting, first.requests_waiting_capacity, first.requests_waiting_deferred) == (7, 5, 2)
    assert (second.requests_waiting_capacity, second.requests_waiting_deferred) == (0, 0)
    assert (first.engine_healthy, second.engine_healthy) == (True, False)
    (model,) = reading.models
    assert model.model_name == "m"
    assert model.admission_rejections_total == 42.0
    assert model.admission_rejections_by_reason == (("max_num_queued_reqs", 41.0), ("max_num_queued_tokens", 1.0))
    assert reading.problems == (
        "vLLM /metrics has no vllm:cache_config_info: KV-cache capacity and block size unknown",
    )


@pytest.mark.parametrize("parse", ["strict", "pick"])
def test_engine_health_applies_to_that_engine_of_every_model(parse: str) -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.1\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.1\n'
        'vllm:engine_healthy{engine="0"} 0\n'
        'vllm:engine_healthy{engine="7"} 0\n'
    )
    reading = _read(text, parse)
    assert [engine.engine_healthy for engine in reading.engines] == [False, False]
    assert (
        "vllm:engine_healthy reports engine '7', which exports no other vLLM metric here: not judged"
        in reading.problems
    )


@pytest.mark.parametrize(
    ("values", "expected"), [(("1", "1"), True), (("1", "0"), False), (("NaN",), None), (("2",), True)]
)
def test_engine_health_values(values: tuple[str, ...], expected: bool | None) -> None:
    # Two series for one engine (never seen from vLLM): unhealthy when any says so; NaN says nothing.
    text = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n' + "".join(
        f'vllm:engine_healthy{{engine="0",pid="{i}"}} {value}\n' for i, value in enumerate(values)
    )
    assert _read(text, "strict").engines[0].engine_healthy is expected


def test_queue_reasons_and_rejections_are_none_before_vllm_has_them() -> None:
    text = (EXPOSITIONS / "vllm-0.10.2-v1.prom").read_text()
    reading = read_vllm(parse_exposition(text, KEPT_SAMPLES), url="u", version="0.10.2")
    assert reading.models == ()
    (engine,) = reading.engines
    assert (engine.requests_waiting_capacity, engine.requests_waiting_deferred, engine.engine_healthy) == (
        None,
        None,
        None,
    )


def test_a_nan_rejection_counter_is_unknown_not_zero() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
        'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} NaN\n'
    )
    (model,) = _read(text, "strict").models
    assert model.admission_rejections_total is None
    assert model.admission_rejections_by_reason == ()
