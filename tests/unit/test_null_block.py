"""Used blocks follow vLLM's own arithmetic for each version: how its usage gauge counts the null block.

Which vLLM does what was read in `BlockPool.get_usage` (vllm/v1/core/block_pool.py) and `BlockPool.__init__` of
every release's wheel from 0.7.3 to 0.33.0, and in V0's `LLMEngine._get_stats`:
- V0 engine: 1 - free / N, no null block (V0 allocates one only for sliding-window attention, lazily);
- V1 0.7.3 (kv_cache_manager.py) to 0.8.2: 1 - free / N, no null block;
- V1 0.8.3 to 0.10.1.1: `self.null_block = self.free_block_queue.popleft()` and still 1 - free / N;
- V1 0.10.2 to 0.33.0: `total_gpu_blocks = self.num_gpu_blocks - 1` ("Subtract 1 to account for null block").
"""

from __future__ import annotations

import pytest

from sidecar.derive.kv import NullBlock, derive_kv, null_block_of, release_of, used_and_free_blocks
from sidecar.model.vllm import MetricSchema
from tests.unit.builders import cache_config, engine


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.7.3", NullBlock.NONE),
        ("0.8.0", NullBlock.NONE),
        ("0.8.2", NullBlock.NONE),
        ("0.8.3", NullBlock.COUNTED),
        ("0.8.5.post1", NullBlock.COUNTED),
        ("0.9.2", NullBlock.COUNTED),
        ("0.10.1", NullBlock.COUNTED),
        ("0.10.1.1", NullBlock.COUNTED),
        ("0.10.2", NullBlock.EXCLUDED),
        ("0.11.0rc2", NullBlock.EXCLUDED),
        ("0.32.0", NullBlock.EXCLUDED),
        ("0.33.0", NullBlock.EXCLUDED),
        ("v0.34.0", NullBlock.EXCLUDED),
        ("0.10.2.dev57+g1a2b3c4", NullBlock.EXCLUDED),  # a dev build counts as the release it leads to
        ("1.0", NullBlock.EXCLUDED),
    ],
)
def test_a_v1_engine_by_its_release(version: str, expected: NullBlock) -> None:
    assert null_block_of(MetricSchema.V1, version) is expected
    assert null_block_of(MetricSchema.V1_LEGACY, version) is expected


@pytest.mark.parametrize("version", ["0.5.4", "0.6.6.post1", "0.9.0", "0.10.2", None])
def test_a_v0_engine_has_no_null_block_whatever_its_release(version: str | None) -> None:
    # 0.8-0.10 still ran V0 with VLLM_USE_V1=0 (and on some platforms): the schema tells the engine.
    assert null_block_of(MetricSchema.V0, version) is NullBlock.NONE


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (MetricSchema.V1, NullBlock.EXCLUDED),  # kv_cache_usage_perc: 0.9.2+, mostly 0.10.2 and later
        (MetricSchema.V1_LEGACY, NullBlock.COUNTED),  # gpu_cache_usage_perc only: 0.7.3-0.9.1, mostly 0.8.3+
        (MetricSchema.UNRECOGNISED, NullBlock.EXCLUDED),
    ],
)
@pytest.mark.parametrize("version", [None, "", "unknown", "main"])
def test_an_unknown_version_is_guessed_from_the_schema(schema: MetricSchema, expected: NullBlock, version: str) -> None:
    assert null_block_of(schema, version) is expected


def test_release_of() -> None:
    assert release_of("0.10.1.1") == (0, 10, 1)
    assert release_of("0.32") == (0, 32, 0)
    assert release_of("v0.33.0") == (0, 33, 0)
    assert release_of("0.11.0rc2") == (0, 11, 0)
    assert release_of(None) is None
    assert release_of("dev") is None


def test_the_real_capture_reads_104_blocks_as_vllm_counted_them() -> None:
    # vLLM 0.32 on CPU under load: 128 blocks, usage 0.8188976377952756 = 104 / 127, 8 running.
    kv = derive_kv(engine(kv_cache_usage_ratio=104 / 127, requests_running=8.0), null_block=NullBlock.EXCLUDED)
    assert kv.used_blocks == pytest.approx(104.0, abs=1e-9)
    assert kv.free_blocks == pytest.approx(23.0, abs=1e-9)
    assert kv.blocks_per_request == pytest.approx(13.0)
    assert kv.request_headroom == pytest.approx(23 / 13)
    assert kv.fragmentation_ratio == pytest.approx(8 * 31 / 2 / (104 * 32))
    # Read as usage x capacity, it was one block high (104.82) and the headroom a block too low.
    assert round(0.8188976377952756 * 128, 4) == 104.8189


def test_a_version_that_counts_the_null_block_as_used() -> None:
    # 0.8.3-0.10.1.1: 40 blocks held of 128 read as 41 / 128, the null block never free.
    kv = derive_kv(engine(kv_cache_usage_ratio=41 / 128, requests_running=4.0), null_block=NullBlock.COUNTED)
    assert kv.used_blocks == pytest.approx(40.0)
    assert kv.free_blocks == pytest.approx(87.0)
    assert kv.request_headroom == pytest.approx(87 / 10)
    # Idle, such a vLLM reads 1 / 128 used: no request holds a block.
    idle = derive_kv(engine(kv_cache_usage_ratio=1 / 128, requests_running=0.0), null_block=NullBlock.COUNTED)
    assert idle.used_blocks == 0.0
    assert idle.free_blocks == pytest.approx(127.0)


def test_a_version_without_a_null_block() -> None:
    kv = derive_kv(engine(kv_cache_usage_ratio=40 / 128, requests_running=4.0), null_block=NullBlock.NONE)
    assert kv.used_blocks == pytest.approx(40.0)
    assert kv.free_blocks == pytest.approx(88.0)
    assert kv.request_headroom == pytest.approx(8.8)


@pytest.mark.parametrize("null_block", list(NullBlock))
def test_used_and_free_stay_within_the_pool(null_block: NullBlock) -> None:
    for usage in (0.0, 0.001, 0.5, 0.999, 1.0):
        used, free = used_and_free_blocks(usage, 2, null_block)
        assert 0.0 <= used <= 2.0
        assert 0.0 <= free <= 2.0


def test_data_parallel_engines_each_hold_their_own_null_block() -> None:
    # 2 engines, 4096 blocks each (vLLM reports the sum, 8192): each excludes its own null block.
    config = cache_config(num_gpu_blocks_server=8192, engines_in_server=2)
    kv = derive_kv(engine(cache_config=config, kv_cache_usage_ratio=0.5, requests_running=1.0))
    assert kv.used_blocks == pytest.approx(4095 / 2)


def test_capacity_in_tokens_prefers_vllms_own_figure() -> None:
    # Hybrid models size blocks per group: num_gpu_blocks x block_size is not the token capacity (vllm#51163).
    assert derive_kv(engine(cache_config=cache_config(kv_cache_size_tokens=3000))).capacity_tokens == 3000
    # Before 0.24 vLLM has no kv_cache_size_tokens: blocks x block size (128 x 32).
    assert derive_kv(engine(cache_config=cache_config(kv_cache_size_tokens=None))).capacity_tokens == 4096
    assert (
        derive_kv(engine(cache_config=cache_config(kv_cache_size_tokens=None, block_size_tokens=None))).capacity_tokens
        is None
    )
    assert derive_kv(engine(cache_config=None)).capacity_tokens is None
