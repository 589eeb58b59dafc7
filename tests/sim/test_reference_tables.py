"""The simulated /metrics against the vLLM metrics reference: every family, its type and its label names.

The expected tables below are written by hand from /work/shared/reference/vllm-metrics.md (section 3 for the
families and the versions that have them, section 2 for labels, section 4 for `cache_config_info`), not from
the simulator's code. For 0.32.0 they are also checked against the real capture, and for 0.6.6 and 0.10.2
against the hand-written fixtures; HELP texts and bucket bounds must match those files too.

vLLM's own shedding and queue reasons were checked in the released wheels' source (vllm/v1/metrics/loggers.py):
`num_requests_waiting_by_reason{reason="capacity"|"deferred"}` first appears in 0.20.0 (not in 0.19.0), and
`admission_rejections_total{model_name,reason}` in 0.32.0 (not in 0.31.0, although `--max-num-queued-reqs`
exists from 0.29.0). `vllm:engine_healthy{engine}` is in no wheel up to 0.33.0: it comes from vLLM's main branch
(vllm/entrypoints/serve/instrumentator/metrics.py, `_EngineHealthCollector`), with --enable-fault-tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sidecar.sim.exposition import CacheSettings, MetricsWriter
from sidecar.sim.records import EngineGauges, FinishedRequest, FinishReason, StepRecord
from tests.conftest import EXPOSITIONS

Table = dict[str, tuple[str, frozenset[str]]]  # exposition name -> (type, label names)

M = frozenset({"model_name"})
ME = frozenset({"model_name", "engine"})
LORA = frozenset({"max_lora", "running_lora_adapters", "waiting_lora_adapters"})

# Section 4: base set of 0.5.4 (10) + is_attention_free (0.6.3). Nothing changes for 0.6.6.
CACHE_0_6 = frozenset(
    {
        "block_size", "cache_dtype", "cpu_offload_gb", "enable_prefix_caching", "gpu_memory_utilization",
        "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override", "sliding_window", "swap_space_bytes",
        "is_attention_free",
    }
)  # fmt: skip
# + calculate_kv_scales (0.7), prefix_caching_hash_algo (0.8.3), swap_space (0.8.5), cpu_kvcache_space_bytes
# (0.9.2), mamba_page_size_padded (0.10.0), kv_sharing_fast_prefill, mamba_cache_dtype, mamba_ssm_cache_dtype
# (0.10.1.1), kv_cache_memory_bytes (0.10.2).
CACHE_0_10 = CACHE_0_6 | {
    "calculate_kv_scales", "prefix_caching_hash_algo", "swap_space", "cpu_kvcache_space_bytes",
    "mamba_page_size_padded", "kv_sharing_fast_prefill", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
    "kv_cache_memory_bytes",
}  # fmt: skip
# The 0.33.0 full set of section 4 without simple_cpu_offload_num_blocks (added in 0.33.0).
CACHE_0_32 = frozenset(
    {
        "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
        "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching",
        "gpu_memory_utilization", "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers",
        "kv_cache_layout", "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
        "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size",
        "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype",
        "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval",
        "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len", "skip_page_size_padded",
        "sliding_window", "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm", "user_specified_block_size",
    }
)  # fmt: skip

# What prometheus_client's default collectors give a single-process (V1) server.
PROCESS: Table = {
    "python_gc_objects_collected_total": ("counter", frozenset({"generation"})),
    "python_gc_objects_uncollectable_total": ("counter", frozenset({"generation"})),
    "python_gc_collections_total": ("counter", frozenset({"generation"})),
    "python_info": ("gauge", frozenset({"implementation", "major", "minor", "patchlevel", "version"})),
    "process_virtual_memory_bytes": ("gauge", frozenset()),
    "process_resident_memory_bytes": ("gauge", frozenset()),
    "process_start_time_seconds": ("gauge", frozenset()),
    "process_cpu_seconds_total": ("counter", frozenset()),
    "process_open_fds": ("gauge", frozenset()),
    "process_max_fds": ("gauge", frozenset()),
}


def _histograms(labels: frozenset[str], *names: str) -> Table:
    return {f"vllm:{name}": ("histogram", labels) for name in names}


# V0 0.6.6, multiprocess registry. Left out although the tables list them for 0.6.x: `tokens_total` (never
# populated, so no series and, in multiprocess mode, no family), the `model_*_time_milliseconds` histograms
# (only with OpenTelemetry detailed traces), `spec_decode_*` (only with speculative decoding).
EXPECTED_0_6: Table = {
    "vllm:cache_config_info": ("gauge", CACHE_0_6),
    "vllm:num_requests_running": ("gauge", M),
    "vllm:num_requests_waiting": ("gauge", M),
    "vllm:num_requests_swapped": ("gauge", M),
    "vllm:gpu_cache_usage_perc": ("gauge", M),
    "vllm:cpu_cache_usage_perc": ("gauge", M),
    "vllm:gpu_prefix_cache_hit_rate": ("gauge", M),
    "vllm:cpu_prefix_cache_hit_rate": ("gauge", M),
    "vllm:avg_prompt_throughput_toks_per_s": ("gauge", M),
    "vllm:avg_generation_throughput_toks_per_s": ("gauge", M),
    "vllm:lora_requests_info": ("gauge", LORA),
    "vllm:num_preemptions_total": ("counter", M),
    "vllm:prompt_tokens_total": ("counter", M),
    "vllm:generation_tokens_total": ("counter", M),
    "vllm:request_success_total": ("counter", M | {"finished_reason"}),
    **_histograms(
        M,
        "iteration_tokens_total", "time_to_first_token_seconds", "time_per_output_token_seconds",
        "e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds", "time_in_queue_requests",
        "request_prompt_tokens", "request_generation_tokens", "request_params_n",
        "request_max_num_generation_tokens", "request_params_max_tokens",
    ),
}  # fmt: skip

# V1 0.10.2, single process, no LoRA and no speculative decoding.
EXPECTED_0_10: Table = {
    **PROCESS,
    "vllm:num_requests_running": ("gauge", ME),
    "vllm:num_requests_waiting": ("gauge", ME),
    "vllm:gpu_cache_usage_perc": ("gauge", ME),
    "vllm:kv_cache_usage_perc": ("gauge", ME),
    "vllm:gpu_prefix_cache_queries_total": ("counter", ME),
    "vllm:gpu_prefix_cache_hits_total": ("counter", ME),
    "vllm:prefix_cache_queries_total": ("counter", ME),
    "vllm:prefix_cache_hits_total": ("counter", ME),
    "vllm:num_preemptions_total": ("counter", ME),
    "vllm:prompt_tokens_total": ("counter", ME),
    "vllm:generation_tokens_total": ("counter", ME),
    "vllm:request_success_total": ("counter", ME | {"finished_reason"}),
    **_histograms(
        ME,
        "iteration_tokens_total", "time_to_first_token_seconds", "time_per_output_token_seconds",
        "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
        "request_inference_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
        "request_prompt_tokens", "request_generation_tokens", "request_params_n",
        "request_max_num_generation_tokens", "request_params_max_tokens",
    ),
    "vllm:cache_config_info": ("gauge", CACHE_0_10 | {"engine"}),
}  # fmt: skip

# V1 0.32.0: the real capture's families without the optional http_* middleware ones.
EXPECTED_0_32: Table = {
    **PROCESS,
    "vllm:estimated_flops_per_gpu_total": ("counter", ME),
    "vllm:estimated_read_bytes_per_gpu_total": ("counter", ME),
    "vllm:estimated_write_bytes_per_gpu_total": ("counter", ME),
    "vllm:num_requests_running": ("gauge", ME),
    "vllm:num_requests_waiting": ("gauge", ME),
    "vllm:num_requests_waiting_by_reason": ("gauge", ME | {"reason"}),
    "vllm:engine_sleep_state": ("gauge", ME | {"sleep_state"}),
    "vllm:kv_cache_usage_perc": ("gauge", ME),
    "vllm:prefix_cache_queries_total": ("counter", ME),
    "vllm:prefix_cache_hits_total": ("counter", ME),
    "vllm:external_prefix_cache_queries_total": ("counter", ME),
    "vllm:external_prefix_cache_hits_total": ("counter", ME),
    "vllm:mm_cache_queries_total": ("counter", ME),
    "vllm:mm_cache_hits_total": ("counter", ME),
    "vllm:num_preemptions_total": ("counter", ME),
    "vllm:prompt_tokens_total": ("counter", ME),
    "vllm:prompt_tokens_by_source_total": ("counter", ME | {"source"}),
    "vllm:prompt_tokens_cached_total": ("counter", ME),
    "vllm:prompt_tokens_cached_by_source_total": ("counter", ME | {"source"}),
    "vllm:generation_tokens_total": ("counter", ME),
    "vllm:request_success_total": ("counter", ME | {"finished_reason"}),
    "vllm:admission_rejections_total": ("counter", M | {"reason"}),
    **_histograms(
        ME,
        "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
        "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
        "time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds", "request_num_preemptions",
        "request_prefill_kv_computed_tokens",
    ),
    "vllm:cache_config_info": ("gauge", CACHE_0_32 | {"engine"}),
}  # fmt: skip

# With --enable-fault-tolerance (the simulator shows vLLM main's collector on its newest profile): one gauge per
# engine of the API server, labelled `engine` alone, no model_name, no _created (a custom collector's gauge).
EXPECTED_0_32_FT: Table = {**EXPECTED_0_32, "vllm:engine_healthy": ("gauge", frozenset({"engine"}))}

EXPECTED = {"0.6": EXPECTED_0_6, "0.10": EXPECTED_0_10, "0.32": EXPECTED_0_32, "0.32-ft": EXPECTED_0_32_FT}
FIXTURES = {
    "0.6": "vllm-0.6.6-v0-prefix-enabled.prom",
    "0.10": "vllm-0.10.2-v1.prom",
    "0.32": "vllm-0.32.0-cpu-under-load.prom",
}
# The token-count buckets run up to max_model_len: 32768 for the 0.6.6 and 0.10.2 fixtures, 512 in the capture.
MAX_MODEL_LEN = {"0.6": 32768, "0.10": 32768, "0.32": 512}
CASES = [("0.6", 1), ("0.10", 1), ("0.10", 2), ("0.32", 1), ("0.32", 2), ("0.32-ft", 1), ("0.32-ft", 2)]


def _exposition(profile: str, engines: int) -> str:
    version, _, ft = profile.partition("-")
    cache = CacheSettings(max_model_len=MAX_MODEL_LEN[version], num_gpu_blocks_per_engine=2048, block_size=16)
    writer = MetricsWriter(version, model_name="sim/tiny", cache=cache, engines=engines, fault_tolerance=bool(ft))
    for engine in range(engines):
        writer.step_done(
            StepRecord(
                engine=engine,
                prompt_tokens_computed=48,
                generation_tokens=2,
                batched_tokens=50,
                preemptions=0,
                prefix_queries_tokens=64,
                prefix_hits_tokens=16,
                prefix_queries_blocks=4,
                prefix_hits_blocks=1,
            )
        )
        writer.request_finished(
            FinishedRequest(
                engine=engine,
                finish_reason=FinishReason.STOP,
                prompt_tokens=64,
                generation_tokens=3,
                max_tokens=32,
                n=1,
                arrival_s=1.0,
                first_scheduled_s=1.1,
                first_token_s=1.3,
                finished_s=1.6,
                num_preemptions=0,
                cached_prompt_tokens=16,
            )
        )
    gauges = [
        EngineGauges(
            engine=engine,
            running=1,
            waiting=0,
            waiting_deferred=0,
            kv_usage_ratio=0.1,
            num_gpu_blocks=2048,
            block_size=16,
            num_cpu_blocks=None,
        )
        for engine in range(engines)
    ]
    return writer.render(gauges, now_s=0.0).decode()


def _table(text: str) -> Table:
    """Exposition name -> (type, label names) of every family except `_created` and http_*."""
    table: Table = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        if name.endswith("_created") or name.startswith("http_"):
            continue
        labels = frozenset(key for sample in family.samples for key in sample.labels if key != "le")
        table[name] = (family.type, labels)
    return table


def _fixture(version: str) -> str:
    return (EXPOSITIONS / FIXTURES[version]).read_text()


@pytest.mark.parametrize(("version", "engines"), CASES)
def test_families_types_and_label_names_are_the_reference_tables(version: str, engines: int) -> None:
    table = _table(_exposition(version, engines))
    expected = EXPECTED[version]
    assert set(table) - set(expected) == set(), "families the reference does not list for this version"
    assert set(expected) - set(table) == set(), "families the reference lists but the simulator does not show"
    for name, (kind, labels) in expected.items():
        assert table[name] == (kind, labels), name


@pytest.mark.parametrize("version", ["0.6", "0.10", "0.32"])
def test_the_hand_written_tables_match_the_reference_expositions(version: str) -> None:
    # Guards the tables above: the 0.32 capture is real; the older fixtures were written from the same reference.
    assert _table(_fixture(version)) == EXPECTED[version]


@pytest.mark.parametrize(
    ("version", "expected", "count"), [("0.6", CACHE_0_6, 11), ("0.10", CACHE_0_10, 20), ("0.32", CACHE_0_32, 36)]
)
def test_cache_config_info_has_exactly_the_section_4_labels(version: str, expected: frozenset[str], count: int) -> None:
    assert len(expected) == count
    engines = 1 if version == "0.6" else 2
    families = {family.name: family for family in text_string_to_metric_families(_exposition(version, engines))}
    samples = families["vllm:cache_config_info"].samples
    assert len(samples) == engines
    with_engine = expected if version == "0.6" else expected | {"engine"}
    for sample in samples:
        assert set(sample.labels) == with_engine
        assert "model_name" not in sample.labels
        assert sample.labels["num_gpu_blocks"] == str(2048 * engines)


@pytest.mark.parametrize("version", ["0.6", "0.10", "0.32"])
def test_help_texts_and_buckets_are_those_of_the_reference_expositions(version: str) -> None:
    ours = {family.name: family for family in text_string_to_metric_families(_exposition(version, 1))}
    theirs = {family.name: family for family in text_string_to_metric_families(_fixture(version))}
    compared = 0
    for name, family in ours.items():
        if not name.startswith("vllm:") or name not in theirs:
            continue
        assert family.documentation == theirs[name].documentation, name
        if family.type == "histogram":
            assert _bounds(family.samples) == _bounds(theirs[name].samples), name
        compared += 1
    assert compared >= 20


def _bounds(samples: Sequence[Sample]) -> list[str]:
    bounds: list[str] = []
    for sample in samples:
        le = sample.labels.get("le")
        if le is not None and le not in bounds:
            bounds.append(le)
    return bounds


@pytest.mark.parametrize("version", ["0.6", "0.10", "0.32"])
def test_vllm_families_come_in_the_order_of_the_reference_expositions(version: str) -> None:
    def order(text: str) -> list[str]:
        return [family.name for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")]

    ours, theirs = order(_exposition(version, 1)), order(_fixture(version))
    assert [name for name in ours if name in theirs] == [name for name in theirs if name in ours]


def test_the_reference_exposition_files_exist() -> None:
    assert all(Path(EXPOSITIONS / name).is_file() for name in FIXTURES.values())
