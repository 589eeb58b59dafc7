"""KV-cache arithmetic for one engine at one instant: capacity, used blocks, headroom, fragmentation. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model.vllm import EngineMetrics


@dataclass(frozen=True, slots=True, kw_only=True)
class KvDerived:
    capacity_blocks: int | None
    block_size_tokens: int | None
    used_blocks: float | None
    blocks_per_request: float | None
    request_headroom: float | None
    fragmentation_ratio: float | None


def derive_kv(engine: EngineMetrics) -> KvDerived:
    config = engine.cache_config
    capacity = None
    block_size = None
    if config is not None:
        block_size = config.block_size_tokens
        if config.num_gpu_blocks_server is not None:
            # vLLM sums num_gpu_blocks over the data-parallel engines of one server (>= 0.9.0).
            capacity = config.num_gpu_blocks_server // config.engines_in_server
    usage = engine.kv_cache_usage_ratio
    running = engine.requests_running
    used = usage * capacity if usage is not None and capacity is not None else None
    per_request = used / running if used is not None and running else None
    headroom = None
    if per_request and capacity is not None and used is not None:
        headroom = max(0.0, (capacity - used) / per_request)
    return KvDerived(
        capacity_blocks=capacity,
        block_size_tokens=block_size,
        used_blocks=used,
        blocks_per_request=per_request,
        request_headroom=headroom,
        fragmentation_ratio=fragmentation(running=running, used_blocks=used, block_size_tokens=block_size),
    )


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
