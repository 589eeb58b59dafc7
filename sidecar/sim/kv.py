"""A paged KV block pool with reference counts and a prefix cache keyed by block hashes. Pure, no I/O.

Modelled on vLLM V1's BlockPool: a block's hash chains its parent's hash with its own token ids, and only full
blocks are hashed. A freed block that holds a hash stays findable in an LRU of evictable blocks, which still
count as free; allocation takes never-cached blocks first and then evicts the least recently freed cached block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from sidecar.sim.config import VllmVersion

ROOT_HASH = 0x5EED  # parent hash of a sequence's first block; an int because hash(None) varies per process


def extend_block_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int, num_tokens: int) -> None:
    """Append to `hashes` the chained hash of every full block among the first `num_tokens` tokens not yet hashed.

    Tuples of ints hash the same in every process (unlike str), so runs are reproducible without a hash library.
    """
    parent = hashes[-1] if hashes else ROOT_HASH
    for start in range(len(hashes) * block_size, num_tokens - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)


class BlockPool:
    """The blocks of one engine. V1 versions hold back one null block, as vLLM V1 does."""

    def __init__(self, *, num_gpu_blocks: int, version: VllmVersion, enable_caching: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be at least 2, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self._version = version
        self._caching = enable_caching
        first = 0 if version == VllmVersion.V0_6 else 1  # V1 takes block 0 as the null block at start
        self._never_cached: deque[int] = deque(range(first, num_gpu_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0 with a hash; oldest first
        self._refcount = [0] * num_gpu_blocks
        self._hash_of: list[int | None] = [None] * num_gpu_blocks
        self._block_of: dict[int, int] = {}  # hash -> block
        self._usable = num_gpu_blocks - first

    @property
    def num_free(self) -> int:
        return len(self._never_cached) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks held by requests (the V1 null block excluded)."""
        return self._usable - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    def usage_ratio(self) -> float:
        """KV cache usage as the version's gauge shows it."""
        if self._version == VllmVersion.V0_6:
            return self.num_used / self.num_gpu_blocks
        # BlockPool.get_usage() since 0.10.2: 1 - free / (num_gpu_blocks - 1), "Subtract 1 to account for null
        # block". (0.8.3-0.10.1.1 divided by num_gpu_blocks, so the null block, never free, read as used.)
        return self.num_used / (self.num_gpu_blocks - 1)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def is_cached(self, block: int) -> bool:
        return self._hash_of[block] is not None

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """The cached blocks of the longest leading run of `hashes`; touches nothing."""
        found: list[int] = []
        if not self._caching:
            return found
        for block_hash in hashes:
            block = self._block_of.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def evictable_among(self, blocks: Sequence[int]) -> int:
        """How many of `blocks` are free (refcount 0): sharing them takes them off the free count."""
        return sum(1 for block in blocks if self._refcount[block] == 0)

    def share(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks found by `lookup`."""
        for block in blocks:
            if self._refcount[block] == 0:
                del self._evictable[block]
            self._refcount[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh blocks, or None (and nothing taken) when fewer are free."""
        if count > self.num_free:
            return None
        blocks: list[int] = []
        for _ in range(count):
            if self._never_cached:
                block = self._never_cached.popleft()
            else:
                block, _ = self._evictable.popitem(last=False)
                evicted = self._hash_of[block]
                if evicted is not None:
                    del self._block_of[evicted]
                self._hash_of[block] = None
            self._refcount[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block. Tail blocks go first, so LRU evicts a sequence's end before its
        shared beginning (vLLM frees in reverse order for the same reason)."""
        for block in reversed(blocks):
            self._refcount[block] -= 1
            if self._refcount[block] > 0:
                continue
            if self._hash_of[block] is not None:
                self._evictable[block] = None
            else:
                self._never_cached.append(block)

    def cache(self, blocks: Sequence[int], hashes: Sequence[int], upto: int) -> None:
        """Register blocks[:upto] (all full) under their hashes; a hash already held by another block stays there."""
        if not self._caching:
            return
        for block, block_hash in zip(blocks[:upto], hashes[:upto], strict=True):
            if self._hash_of[block] is not None or block_hash in self._block_of:
                continue
            self._hash_of[block] = block_hash
            self._block_of[block_hash] = block
