"""The `vllm:cache_config_info` label set of each simulated vLLM version. Pure: no I/O.

vLLM builds it as `{key: str(value) for key, value in cache_config.__dict__.items()}`, so every value is the
`str()` of a Python value ("None", "True", "0.9", "4294967296.0"). The key sets are those of section 4 of
the vLLM metrics reference: 11 keys in 0.6.x, 20 in 0.10.2, 36 in 0.32.0; V1 adds `engine`. Fields the
simulator has no notion of (Mamba, offloading, hybrid models) keep vLLM's defaults, as the real captures
show them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.sim.exposition_profiles import Version

_GIB_BYTES = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSettings:
    """What `vllm serve` was started with, as far as `cache_config_info` and the token buckets show it."""

    max_model_len: int
    num_gpu_blocks_per_engine: int  # until the engines report their own (EngineGauges.num_gpu_blocks)
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes (0.10.2+)
    num_cpu_blocks: int | None = None  # V0 swap space blocks; V1 always reports None
    swap_space_gib: int = 4  # V0 and V1 up to 0.11: --swap-space
    cache_dtype: str = "auto"
    user_specified_block_size: bool = False  # 0.18+: whether --block-size was given

    def __post_init__(self) -> None:
        if self.max_model_len < 1 or self.block_size < 1 or self.num_gpu_blocks_per_engine < 0:
            raise ValueError("max_model_len and block_size must be positive, num_gpu_blocks_per_engine >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCache:
    """One engine's KV pool as it reported it at start-up."""

    num_gpu_blocks: int
    block_size: int
    num_cpu_blocks: int | None


def cache_config_labels(
    version: Version, settings: CacheSettings, *, engine: EngineCache, total_gpu_blocks: int
) -> dict[str, str]:
    """The label set of one engine's series, without `engine`. `total_gpu_blocks` is the data-parallel sum."""
    common = {
        "block_size": str(engine.block_size),
        "cache_dtype": settings.cache_dtype,
        "enable_prefix_caching": str(settings.enable_prefix_caching),
        "gpu_memory_utilization": str(settings.gpu_memory_utilization),
        "is_attention_free": "False",
        "num_gpu_blocks": str(total_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
    }
    if version is Version.V0_6:
        return {
            **common,
            "cpu_offload_gb": "0",
            "num_cpu_blocks": str(engine.num_cpu_blocks),
            "swap_space_bytes": str(settings.swap_space_gib * _GIB_BYTES),
        }
    v1_common = {
        **common,
        "kv_cache_memory_bytes": str(settings.kv_cache_memory_bytes),
        "kv_sharing_fast_prefill": "False",
        "mamba_cache_dtype": "auto",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
    }
    if version is Version.V0_10:
        return {
            **v1_common,
            "calculate_kv_scales": "False",
            "cpu_kvcache_space_bytes": "None",
            "cpu_offload_gb": "0",
            "prefix_caching_hash_algo": "builtin",
            "swap_space": str(settings.swap_space_gib),
            "swap_space_bytes": str(float(settings.swap_space_gib * _GIB_BYTES)),
        }
    size_tokens = engine.num_gpu_blocks * engine.block_size
    return {
        **v1_common,
        "_block_size_resolved": "True",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(engine.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "hash_block_size": "None",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        # Per engine, not summed over data-parallel ranks (0.24+).
        "kv_cache_max_concurrency": str(size_tokens / settings.max_model_len),
        "kv_cache_size_tokens": str(size_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "mamba_block_size": "None",
        "mamba_cache_mode": "none",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": str(settings.user_specified_block_size),
    }
