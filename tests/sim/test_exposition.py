"""The simulated vLLM's /metrics writer: it parses, the sidecar's reader agrees with it, and it counts as fed."""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.parse.exposition import parse_exposition
from sidecar.sim.exposition import CONTENT_TYPE, CacheSettings, MetricsWriter
from sidecar.sim.records import EngineGauges, FinishedRequest, FinishReason, StepRecord

PROFILES = [("0.6", 1), ("0.10", 1), ("0.10", 2), ("0.32", 1), ("0.32", 2)]
Flat = list[tuple[str, tuple[tuple[str, str], ...], float]]


def _writer(version: str, engines: int = 1, *, prefix_caching: bool = True) -> MetricsWriter:
    cache = CacheSettings(
        max_model_len=4096, num_gpu_blocks_per_engine=1000, block_size=16, enable_prefix_caching=prefix_caching
    )
    return MetricsWriter(version, model_name="sim/tiny", cache=cache, engines=engines)


def _step(engine: int = 0, *, computed: int = 96, generated: int = 4, preemptions: int = 0) -> StepRecord:
    return StepRecord(
        engine=engine,
        prompt_tokens_computed=computed,
        generation_tokens=generated,
        batched_tokens=computed + generated,
        preemptions=preemptions,
        prefix_queries_tokens=128,
        prefix_hits_tokens=32,
        prefix_queries_blocks=8,
        prefix_hits_blocks=2,
    )


def _finished(engine: int = 0, reason: FinishReason = FinishReason.LENGTH, *, generated: int = 5) -> FinishedRequest:
    return FinishedRequest(
        engine=engine,
        finish_reason=reason,
        prompt_tokens=128,
        generation_tokens=generated,
        max_tokens=16,
        n=1,
        arrival_s=100.0,
        first_scheduled_s=100.25,
        first_token_s=100.5,
        finished_s=101.5,
        num_preemptions=1,
        cached_prompt_tokens=32,
    )


def _gauges(engines: int, *, blocks: tuple[int, ...] = (), usage: float = 0.25) -> list[EngineGauges]:
    return [
        EngineGauges(
            engine=engine,
            running=3 + engine,
            waiting=2,
            waiting_deferred=1,
            kv_usage_ratio=usage,
            num_gpu_blocks=blocks[engine] if blocks else 1000,
            block_size=16,
            num_cpu_blocks=None,
        )
        for engine in range(engines)
    ]


def _fed(version: str, engines: int) -> str:
    writer = _writer(version, engines)
    for engine in range(engines):
        writer.step_done(_step(engine))
        writer.step_done(_step(engine, computed=0, generated=8, preemptions=1))
        writer.request_finished(_finished(engine))
        writer.request_finished(_finished(engine, FinishReason.STOP, generated=1))
    return writer.render(_gauges(engines), now_s=0.0).decode()


@functools.lru_cache(maxsize=16)
def _reference(text: str) -> Flat:
    return sorted(
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def _value(text: str, name: str, **labels: str) -> float:
    rows = _reference(text)
    found = [value for sample_name, pairs, value in rows if sample_name == name and labels.items() <= set(pairs)]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


@pytest.mark.parametrize(("version", "engines"), PROFILES)
def test_the_reference_parser_reads_it(version: str, engines: int) -> None:
    text = _fed(version, engines)
    names = {sample_name for sample_name, _, _ in _reference(text)}
    assert "vllm:num_requests_running" in names
    assert "vllm:cache_config_info" in names


@pytest.mark.parametrize(("version", "engines"), PROFILES)
def test_the_sidecar_parser_agrees_sample_for_sample(version: str, engines: int) -> None:
    text = _fed(version, engines)
    exposition = parse_exposition(text)
    ours = sorted(
        (sample.name, tuple(sorted(sample.labels)), sample.value)
        for samples in exposition.samples.values()
        for sample in samples
    )
    reference = _reference(text)
    assert [(n, labels, repr(v)) for n, labels, v in ours] == [(n, labels, repr(v)) for n, labels, v in reference]


@pytest.mark.parametrize(("version", "engines"), PROFILES)
def test_counters_move_as_fed(version: str, engines: int) -> None:
    writer = _writer(version, engines)
    before = writer.render(_gauges(engines), now_s=0.0).decode()
    for engine in range(engines):
        writer.step_done(_step(engine, preemptions=2))
        writer.request_finished(_finished(engine))
    after = writer.render(_gauges(engines), now_s=0.0).decode()
    for engine in range(engines):
        labels = {"engine": str(engine)} if version != "0.6" else {}
        assert _delta(before, after, "vllm:prompt_tokens_total", **labels) == 96 + 32
        assert _delta(before, after, "vllm:generation_tokens_total", **labels) == 4
        assert _delta(before, after, "vllm:num_preemptions_total", **labels) == 2
        assert _delta(before, after, "vllm:request_success_total", **labels, finished_reason="length") == 1
        assert _delta(before, after, "vllm:e2e_request_latency_seconds_count", **labels) == 1
        seconds = {
            "e2e_request_latency_seconds": 1.5,
            "time_to_first_token_seconds": 0.5,
            "request_queue_time_seconds": 0.25,
            "request_prefill_time_seconds": 0.25,
            "request_decode_time_seconds": 1.0,
            "request_inference_time_seconds": 1.25,
        }
        for name, expected_s in seconds.items():
            assert _delta(before, after, f"vllm:{name}_sum", **labels) == pytest.approx(expected_s), name
        assert _delta(before, after, "vllm:iteration_tokens_total_count", **labels) == 1
        # One inter-token interval per generated token after the first.
        per_token = "vllm:time_per_output_token_seconds" if version != "0.32" else "vllm:inter_token_latency_seconds"
        assert _delta(before, after, per_token + "_count", **labels) == 4
        assert _delta(before, after, per_token + "_sum", **labels) == pytest.approx(1.0)
        if version != "0.6":
            assert _delta(before, after, "vllm:prefix_cache_queries_total", **labels) == 128
            assert _delta(before, after, "vllm:prefix_cache_hits_total", **labels) == 32


def _delta(before: str, after: str, name: str, **labels: str) -> float:
    """How much a sample grew; a V0 series that did not exist yet started at 0."""
    start = _value(before, name, **labels) if f"{name}{{" in before else 0.0
    return _value(after, name, **labels) - start


def test_iteration_tokens_follow_each_versions_rule() -> None:
    for version, expected in (("0.6", 96 + 32 + 4), ("0.10", 96 + 32 + 4), ("0.32", 96 + 4)):
        writer = _writer(version)
        writer.step_done(_step())
        text = writer.render(_gauges(1), now_s=0.0).decode()
        assert _value(text, "vllm:iteration_tokens_total_sum") == expected, version


def test_v0_has_no_created_series_and_no_process_families() -> None:
    text = _fed("0.6", 1)
    assert "_created" not in text
    assert "python_" not in text
    assert "process_" not in text


@pytest.mark.parametrize(("version", "engines"), [p for p in PROFILES if p[0] != "0.6"])
def test_v1_has_one_created_series_per_counter_and_histogram_series(version: str, engines: int) -> None:
    text = _fed(version, engines)
    series: dict[str, set[tuple[tuple[str, str], ...]]] = defaultdict(set)
    created: dict[str, list[tuple[tuple[str, str], ...]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            if family.type in ("counter", "histogram") and family.name.startswith("vllm:"):
                series[family.name].add(labels)
            elif family.name.endswith("_created"):
                created[family.name.removesuffix("_created")].append(labels)
    assert series
    for name, label_sets in series.items():
        assert sorted(created[name]) == sorted(label_sets), name
    assert set(created) == set(series)


@pytest.mark.parametrize("version", ["0.10", "0.32"])
def test_data_parallel_cache_config_info_sums_num_gpu_blocks(version: str) -> None:
    writer = _writer(version, 2)
    text = writer.render(_gauges(2, blocks=(4096, 4000)), now_s=0.0).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = families["vllm:cache_config_info"].samples
    assert sorted(sample.labels["engine"] for sample in samples) == ["0", "1"]
    assert {sample.labels["num_gpu_blocks"] for sample in samples} == {"8096"}
    assert all(sample.value == 1.0 for sample in samples)
    if version == "0.32":
        by_engine = {sample.labels["engine"]: sample.labels for sample in samples}
        assert by_engine["0"]["kv_cache_size_tokens"] == str(4096 * 16)
        assert by_engine["1"]["kv_cache_size_tokens"] == str(4000 * 16)
        assert by_engine["0"]["kv_cache_max_concurrency"] == str(4096 * 16 / 4096)


def test_cache_config_info_keeps_one_series_per_engine_when_the_engines_report_new_blocks() -> None:
    writer = _writer("0.32", 2)
    first = writer.render(_gauges(2), now_s=0.0).decode()
    assert _value(first, "vllm:cache_config_info", engine="0", num_gpu_blocks="2000") == 1.0
    second = writer.render(_gauges(2, blocks=(1500, 1500)), now_s=0.0).decode()
    assert second.count("vllm:cache_config_info{") == 2
    assert _value(second, "vllm:cache_config_info", engine="1", num_gpu_blocks="3000") == 1.0


def test_v0_prefix_hit_rate_is_minus_one_with_prefix_caching_off() -> None:
    writer = _writer("0.6", prefix_caching=False)
    writer.step_done(_step())
    text = writer.render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:gpu_prefix_cache_hit_rate") == -1.0
    assert _value(text, "vllm:cpu_prefix_cache_hit_rate") == -1.0
    assert _value(text, "vllm:cache_config_info", enable_prefix_caching="False") == 1.0


def test_v0_prefix_hit_rate_is_block_hits_over_block_queries_since_start() -> None:
    writer = _writer("0.6")
    assert _value(writer.render(_gauges(1), now_s=0.0).decode(), "vllm:gpu_prefix_cache_hit_rate") == 0.0
    writer.step_done(_step())
    writer.step_done(_step())
    text = writer.render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:gpu_prefix_cache_hit_rate") == 4 / 16
    assert _value(text, "vllm:cpu_prefix_cache_hit_rate") == 0.0


def test_v0_average_throughput_is_refreshed_after_five_seconds() -> None:
    writer = _writer("0.6")
    writer.render(_gauges(1), now_s=10.0)
    writer.step_done(_step())
    early = writer.render(_gauges(1), now_s=12.0).decode()
    assert _value(early, "vllm:avg_prompt_throughput_toks_per_s") == 0.0
    late = writer.render(_gauges(1), now_s=18.0).decode()
    assert _value(late, "vllm:avg_prompt_throughput_toks_per_s") == pytest.approx(128 / 8)
    assert _value(late, "vllm:avg_generation_throughput_toks_per_s") == pytest.approx(4 / 8)


def test_v0_lora_info_is_always_there_without_lora() -> None:
    text = _writer("0.6").render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:lora_requests_info", max_lora="0", running_lora_adapters="") > 1e9


@pytest.mark.parametrize(("version", "engines"), PROFILES)
def test_histogram_buckets_are_cumulative_and_end_at_the_count(version: str, engines: int) -> None:
    text = _fed(version, engines)
    checked = 0
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        counts: dict[tuple[tuple[str, str], ...], float] = {}
        for sample in family.samples:
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            if sample.name.endswith("_bucket"):
                buckets[key].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                counts[key] = sample.value
        for key, rows in buckets.items():
            bounds = [bound for bound, _ in rows]
            values = [value for _, value in rows]
            assert bounds == sorted(bounds), family.name
            assert math.isinf(bounds[-1]), family.name
            assert values == sorted(values), family.name
            assert values[-1] == counts[key], family.name
            checked += 1
    assert checked > 10


def test_v1_precreates_every_finish_reason_and_maps_error_the_way_the_version_does() -> None:
    old = _writer("0.10")
    old.request_finished(_finished(reason=FinishReason.ERROR))
    text = old.render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(text, "vllm:request_success_total", finished_reason="stop") == 0
    assert 'finished_reason="error"' not in text
    new = _writer("0.32")
    new.request_finished(_finished(reason=FinishReason.ERROR))
    text = new.render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:request_success_total", finished_reason="error") == 1
    assert _value(text, "vllm:request_success_total", finished_reason="repetition") == 0


def test_0_32_splits_waiting_by_reason_and_the_engines_are_awake() -> None:
    text = _writer("0.32").render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:num_requests_waiting") == 2
    assert _value(text, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
    assert _value(text, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1
    assert _value(text, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert _value(text, "vllm:engine_sleep_state", sleep_state="discard_all") == 0


def test_0_10_shows_old_and_new_kv_usage_and_prefix_counters_alike() -> None:
    writer = _writer("0.10")
    writer.step_done(_step())
    text = writer.render(_gauges(1, usage=0.75), now_s=0.0).decode()
    assert _value(text, "vllm:gpu_cache_usage_perc") == _value(text, "vllm:kv_cache_usage_perc") == 0.75
    assert _value(text, "vllm:gpu_prefix_cache_hits_total") == _value(text, "vllm:prefix_cache_hits_total") == 32


def test_request_that_never_ran_only_counts_where_it_has_timestamps() -> None:
    writer = _writer("0.32")
    aborted = FinishedRequest(
        engine=0,
        finish_reason=FinishReason.ABORT,
        prompt_tokens=10,
        generation_tokens=0,
        max_tokens=16,
        n=1,
        arrival_s=5.0,
        first_scheduled_s=None,
        first_token_s=None,
        finished_s=7.0,
        num_preemptions=0,
        cached_prompt_tokens=0,
    )
    writer.request_finished(aborted)
    text = writer.render(_gauges(1), now_s=0.0).decode()
    assert _value(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(text, "vllm:e2e_request_latency_seconds_sum") == 2.0
    assert _value(text, "vllm:request_queue_time_seconds_count") == 0
    assert _value(text, "vllm:time_to_first_token_seconds_count") == 0


def test_content_type_is_the_classic_text_format() -> None:
    assert _writer("0.32").content_type == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unsupported vLLM version"):
        _writer("0.7")
    with pytest.raises(ValueError, match="engines"):
        _writer("0.6", 2)
    writer = _writer("0.32", 2)
    with pytest.raises(ValueError, match="out of range"):
        writer.step_done(_step(engine=2))
    assert _writer("0.32.0").version == _writer("v0.32").version


def test_writers_do_not_share_state() -> None:
    first, second = _writer("0.32"), _writer("0.32")
    first.step_done(_step())
    assert _value(second.render(_gauges(1), now_s=0.0).decode(), "vllm:prompt_tokens_total") == 0
