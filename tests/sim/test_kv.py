"""The block pool and prefix cache: full-block hashes, shared references, LRU eviction, usage per version."""

from __future__ import annotations

import pytest

from sidecar.sim.config import VllmVersion
from sidecar.sim.kv import BlockPool, extend_block_hashes


def hashes_of(tokens: list[int], block_size: int = 4) -> list[int]:
    hashes: list[int] = []
    extend_block_hashes(hashes, tokens, block_size, len(tokens))
    return hashes


def test_only_full_blocks_are_hashed() -> None:
    assert len(hashes_of(list(range(7)))) == 1
    assert len(hashes_of(list(range(8)))) == 2
    assert hashes_of([1, 2, 3]) == []


def test_hash_chains_the_parent() -> None:
    # The same second block after different first blocks is a different cache entry.
    first = hashes_of([1, 1, 1, 1, 9, 9, 9, 9])
    second = hashes_of([2, 2, 2, 2, 9, 9, 9, 9])
    assert first[1] != second[1]
    assert hashes_of([1, 1, 1, 1, 5, 5, 5, 5])[0] == first[0]


def test_hashes_extend_incrementally() -> None:
    tokens = list(range(20))
    partial: list[int] = []
    extend_block_hashes(partial, tokens, 4, 9)
    assert len(partial) == 2
    extend_block_hashes(partial, tokens, 4, 20)
    assert partial == hashes_of(tokens)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (VllmVersion.V0_6, 104 / 128),
        # 0.10.2's BlockPool.get_usage: 1 - free / (num_gpu_blocks - 1), as every release since (0.8.3-0.10.1.1
        # divided by num_gpu_blocks and so counted the never-free null block as used: 105 / 128).
        (VllmVersion.V0_10, 104 / 127),
        (VllmVersion.V0_32, 104 / 127),  # measured on a real 0.32: 0.8189
    ],
)
def test_usage_denominator_per_version(version: VllmVersion, expected: float) -> None:
    pool = BlockPool(num_gpu_blocks=128, version=version, enable_caching=True)
    assert pool.allocate(104) is not None
    assert pool.num_used == 104
    assert pool.usage_ratio() == pytest.approx(expected)
    if version == VllmVersion.V0_32:
        assert round(pool.usage_ratio(), 4) == 0.8189


def test_v1_holds_back_a_null_block() -> None:
    v1 = BlockPool(num_gpu_blocks=8, version=VllmVersion.V0_32, enable_caching=True)
    v0 = BlockPool(num_gpu_blocks=8, version=VllmVersion.V0_6, enable_caching=True)
    assert v1.num_free == 7
    assert v0.num_free == 8
    assert v1.allocate(8) is None
    assert v1.num_free == 7, "a refused allocation takes nothing"
    assert v1.usage_ratio() == 0.0
    assert BlockPool(num_gpu_blocks=8, version=VllmVersion.V0_10, enable_caching=True).usage_ratio() == 0.0


def test_lookup_finds_the_leading_cached_run_and_sharing_counts_references() -> None:
    pool = BlockPool(num_gpu_blocks=16, version=VllmVersion.V0_32, enable_caching=True)
    hashes = hashes_of(list(range(12)))
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.cache(blocks, hashes, 2)  # the third block is not full yet
    assert pool.lookup(hashes) == blocks[:2]
    other = hashes_of([*range(4), 99, 99, 99, 99, 8, 9, 10, 11])
    assert pool.lookup(other) == blocks[:1], "a miss ends the run even if later blocks match by content"
    pool.share(blocks[:2])
    assert [pool.refcount(b) for b in blocks] == [2, 2, 1]
    pool.free(blocks)
    assert [pool.refcount(b) for b in blocks] == [1, 1, 0]
    assert pool.num_used == 2


def test_freed_cached_blocks_stay_findable_and_count_as_free() -> None:
    pool = BlockPool(num_gpu_blocks=9, version=VllmVersion.V0_32, enable_caching=True)
    hashes = hashes_of(list(range(8)))
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache(blocks, hashes, 2)
    pool.free(blocks)
    assert pool.num_free == 8
    assert pool.usage_ratio() == 0.0
    assert pool.lookup(hashes) == blocks
    assert pool.evictable_among(blocks) == 2
    pool.share(blocks)
    assert pool.num_free == 6, "sharing an evictable block takes it off the free count"


def test_allocation_prefers_never_cached_blocks_then_evicts_lru() -> None:
    pool = BlockPool(num_gpu_blocks=5, version=VllmVersion.V0_6, enable_caching=True)
    a_hashes, b_hashes = hashes_of([1] * 4), hashes_of([2] * 4)
    a = pool.allocate(1)
    b = pool.allocate(1)
    assert a is not None
    assert b is not None
    pool.cache(a, a_hashes, 1)
    pool.cache(b, b_hashes, 1)
    pool.free(a)  # a is the least recently freed
    pool.free(b)
    fresh = pool.allocate(3)
    assert fresh is not None
    assert not set(fresh) & {a[0], b[0]}, "never-cached blocks go first"
    assert pool.lookup(a_hashes) == a
    evicted = pool.allocate(1)
    assert evicted == a
    assert pool.lookup(a_hashes) == [], "the evicted block's hash is gone"
    assert pool.lookup(b_hashes) == b
    assert not pool.is_cached(a[0])


def test_a_sequence_frees_its_tail_first_so_its_prefix_survives_longest() -> None:
    pool = BlockPool(num_gpu_blocks=3, version=VllmVersion.V0_6, enable_caching=True)
    hashes = hashes_of(list(range(12)))
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.cache(blocks, hashes, 3)
    pool.free(blocks)
    assert pool.allocate(1) == [blocks[2]]
    assert pool.lookup(hashes) == blocks[:2]


def test_disabled_prefix_caching_never_hits() -> None:
    pool = BlockPool(num_gpu_blocks=8, version=VllmVersion.V0_32, enable_caching=False)
    hashes = hashes_of(list(range(8)))
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache(blocks, hashes, 2)
    assert pool.lookup(hashes) == []
    assert pool.num_cached == 0


def test_a_duplicate_hash_stays_with_its_first_block() -> None:
    pool = BlockPool(num_gpu_blocks=8, version=VllmVersion.V0_32, enable_caching=True)
    hashes = hashes_of([7] * 4)
    first, second = pool.allocate(1), pool.allocate(1)
    assert first is not None
    assert second is not None
    pool.cache(first, hashes, 1)
    pool.cache(second, hashes, 1)
    assert pool.lookup(hashes) == first
    assert not pool.is_cached(second[0])
