"""KV-cache arithmetic for one engine at one instant: capacity, used blocks, headroom, fragmentation. Pure.

Used blocks follow vLLM's own arithmetic for the version at hand. vLLM V1 takes one block of the pool as its
"null block" (a placeholder that never holds a token and is never free), and its usage gauge has treated that
block three ways (`BlockPool.get_usage`, vllm/v1/core/block_pool.py, read in every release's wheel):

| vLLM | usage gauge | blocks requests hold | free blocks |
|---|---|---|---|
| V0 engine (all) | 1 - free / N (no null block; V0 takes one only for sliding windows) | u x N | (1 - u) x N |
| V1 0.7.3 - 0.8.2 | 1 - free / N (no null block yet) | u x N | (1 - u) x N |
| V1 0.8.3 - 0.10.1.1 | 1 - free / N, the null block never free | u x N - 1 | (1 - u) x N |
| V1 0.10.2 and later | 1 - free / (N - 1) ("Subtract 1 to account for null block") | u x (N - 1) | (1 - u) x (N - 1) |

N is the engine's `num_gpu_blocks` and u the gauge. Measured on vLLM 0.32 on CPU: 0.8189 = 104 / 127 with 128
blocks, 104 blocks held.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from sidecar.model.vllm import EngineMetrics, MetricSchema


class NullBlock(StrEnum):
    """How vLLM's usage gauge counts the null block (see the module docstring)."""

    NONE = "none"  # no null block: usage = used / N
    COUNTED = "counted"  # a null block the gauge counts as used: usage = (used + 1) / N
    EXCLUDED = "excluded"  # a null block left out of the denominator: usage = used / (N - 1)


_FIRST_NULL_BLOCK = (0, 8, 3)  # BlockPool takes block 0 as the null block from 0.8.3 on
_NULL_BLOCK_EXCLUDED = (0, 10, 2)  # get_usage divides by num_gpu_blocks - 1 from 0.10.2 on
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def release_of(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version string ("0.10.1.1", "0.11.0rc2", "0.10.2.dev5+g1234"); None when
    unknown. A development build counts as the release it leads to, which is what setuptools-scm names it after."""
    match = _RELEASE.match(version or "")
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def null_block_of(schema: MetricSchema, version: str | None) -> NullBlock:
    """The null-block arithmetic of the vLLM that wrote this reading: its engine from the metric schema, its
    release from /version.

    Without a version (a server without /version, or one that answered something unreadable) the schema has to
    do: V1 names before 0.9.2 (`v1-legacy`: 0.7.3-0.9.1) mostly come from 0.8.3-0.9.1, which count the null block;
    the current names (0.9.2+) mostly from 0.10.2 and later, which exclude it. A wrong guess is less than one
    block off either way.
    """
    if schema is MetricSchema.V0:
        return NullBlock.NONE
    release = release_of(version)
    if release is None:
        return NullBlock.COUNTED if schema is MetricSchema.V1_LEGACY else NullBlock.EXCLUDED
    if release >= _NULL_BLOCK_EXCLUDED:
        return NullBlock.EXCLUDED
    return NullBlock.COUNTED if release >= _FIRST_NULL_BLOCK else NullBlock.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class KvDerived:
    capacity_blocks: int | None
    block_size_tokens: int | None
    used_blocks: float | None
    blocks_per_request: float | None
    request_headroom: float | None
    fragmentation_ratio: float | None
    capacity_tokens: int | None = None  # vLLM's kv_cache_size_tokens (0.24+), else capacity x block size
    free_blocks: float | None = None  # blocks a new request can get, as vLLM counts them


def derive_kv(engine: EngineMetrics, *, null_block: NullBlock = NullBlock.EXCLUDED) -> KvDerived:
    """`null_block`: how this engine's vLLM counts its null block (`null_block_of`); the default is what vLLM
    has done since 0.10.2."""
    config = engine.cache_config
    capacity = None
    block_size = None
    tokens = None
    if config is not None:
        block_size = config.block_size_tokens
        if config.num_gpu_blocks_server is not None:
            # vLLM sums num_gpu_blocks over the data-parallel engines of one server (>= 0.9.0).
            capacity = config.num_gpu_blocks_server // config.engines_in_server
        # vLLM's own figure is per engine and right where blocks differ in size (hybrid models: vllm#51163).
        tokens = config.kv_cache_size_tokens
        if tokens is None and capacity is not None and block_size is not None:
            tokens = capacity * block_size
    usage = engine.kv_cache_usage_ratio
    running = engine.requests_running
    used = free = None
    if usage is not None and capacity is not None:
        used, free = used_and_free_blocks(usage, capacity, null_block)
    per_request = used / running if used is not None and running else None
    headroom = None
    if per_request and free is not None:
        headroom = max(0.0, free / per_request)
    return KvDerived(
        capacity_blocks=capacity,
        block_size_tokens=block_size,
        used_blocks=used,
        blocks_per_request=per_request,
        request_headroom=headroom,
        fragmentation_ratio=fragmentation(running=running, used_blocks=used, block_size_tokens=block_size),
        capacity_tokens=tokens,
        free_blocks=free,
    )


def used_and_free_blocks(usage: float, capacity: int, null_block: NullBlock) -> tuple[float, float]:
    """Blocks held by requests and blocks free, from vLLM's usage gauge and the engine's `num_gpu_blocks`."""
    if null_block is NullBlock.EXCLUDED:
        usable = max(0, capacity - 1)
        return usage * usable, max(0.0, (1.0 - usage) * usable)
    free = max(0.0, (1.0 - usage) * capacity)
    if null_block is NullBlock.COUNTED:
        return max(0.0, usage * capacity - 1), free  # the null block is the one used block no request holds
    return usage * capacity, free


def fragmentation(*, running: float | None, used_blocks: float | None, block_size_tokens: int | None) -> float | None:
    """Estimated share of used KV slots holding no token.

    vLLM fills blocks in order, so only each running request's last block is partly empty; with request
    lengths spread evenly, it is on average (block_size - 1) / 2 slots short. Prefix-shared blocks make
    the estimate conservative (high), which is the safe side for a pressure signal.
    """
    if running is None or not used_blocks or not block_size_tokens:
        return None
    empty_slots = running * (block_size_tokens - 1) / 2
    return min(1.0, max(0.0, empty_slots / (used_blocks * block_size_tokens)))
