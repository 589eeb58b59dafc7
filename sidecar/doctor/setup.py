"""The server's configuration as far as the evidence shows it, each value with where it came from. Pure.

vLLM publishes only part of its configuration on /metrics (`cache_config_info`) and /v1/models; the rest
comes from the arguments it logged at start. A `non-default args` line (0.9+) makes a missing argument a
known default; an old `args: Namespace(...)` line lists every argument, None when unset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sidecar.doctor.evidence import Evidence
from sidecar.doctor.logfacts import STATED_BY_VLLM, LogFacts, ServerArgs
from sidecar.doctor.versions import Version, at_least, parse_version
from sidecar.model.gpu import GpuDevice
from sidecar.model.vllm import CacheConfig

T = TypeVar("T")
GIB = 2**30
LARGE_CARD_BYTES = 70 * GIB  # vLLM's own threshold for its larger batch defaults (EngineArgs.get_batch_defaults)
DEFAULT_UTILIZATION = 0.9  # --gpu-memory-utilization's default in every release
V0_MAX_NUM_SEQS = 256  # V0's default (0.5-0.10), the same for every card
V1_CARD_DEFAULTS = (0, 9, 0)  # defaults by card size for the OpenAI server (earlier V1 lines: by GPU name)

LOG_ARGS = STATED_BY_VLLM
LOG_DEFAULT = "vLLM's default: absent from the non-default arguments it logged"
CACHE_CONFIG = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class Fact(Generic[T]):
    value: T
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    version: Version | None
    version_text: str | None
    max_model_len: Fact[int] | None
    max_num_seqs: Fact[int] | None
    max_num_batched_tokens: Fact[int] | None
    gpu_memory_utilization: Fact[float] | None
    block_size: Fact[int] | None
    prefix_caching: Fact[bool] | None
    kv_pool_tokens: Fact[int] | None  # per engine: the smallest engine's pool
    shutdown_timeout: Fact[int] | None
    tensor_parallel_size: int
    quantization: str | None
    kv_cache_dtype: str | None
    device: str | None  # "cpu" when the log says vLLM runs on the CPU backend
    weights_gib: Fact[float] | None
    card: GpuDevice | None  # the first watched GPU, for defaults that depend on its size
    v0_log: bool = False  # the log is V0's (its engine, or its `# CPU blocks` line): a release before V0's removal
    # no argument, config or rank beyond 0 says how many GPUs hold the model, but the log's workers span several
    tensor_parallel_unknown: bool = False


def resolve(evidence: Evidence) -> Setup:
    log = evidence.log
    args = log.args if log is not None else None
    version_text = (
        evidence.live.version
        or (log.version if log is not None else None)
        or (evidence.history.vllm_version if evidence.history is not None else None)
    )
    version = parse_version(version_text)
    card = _card(evidence)
    configs = _cache_configs(evidence)
    defaults_known = args is not None and not args.complete
    stated_tp, ranks_tp = _stated_tensor_parallel(log), _ranks(log)

    def from_args(name: str, default: T | None) -> Fact[T] | None:
        value = getattr(args, name) if args is not None else None
        if value is not None and args is not None:
            return Fact(value, args.stated_by)
        if defaults_known and default is not None and args is not None:
            return Fact(default, _default_source(args))
        return None

    utilization = next((c.gpu_memory_utilization for c in configs if c.gpu_memory_utilization is not None), None)
    block = next((c.block_size_tokens for c in configs if c.block_size_tokens is not None), None)
    caching = next((c.enable_prefix_caching for c in configs if c.enable_prefix_caching is not None), None)
    seqs_default, batched_default = batch_defaults(version, card)
    return Setup(
        version=version,
        version_text=version_text,
        max_model_len=_max_model_len(evidence, log),
        max_num_seqs=from_args("max_num_seqs", seqs_default),
        max_num_batched_tokens=from_args("max_num_batched_tokens", batched_default),
        gpu_memory_utilization=Fact(utilization, CACHE_CONFIG)
        if utilization is not None
        else _log_utilization(log) or from_args("gpu_memory_utilization", DEFAULT_UTILIZATION),
        block_size=Fact(block, CACHE_CONFIG) if block is not None else from_args("block_size", None),
        prefix_caching=Fact(caching, CACHE_CONFIG) if caching is not None else from_args("enable_prefix_caching", None),
        kv_pool_tokens=_pool_tokens(configs, log),
        shutdown_timeout=from_args("shutdown_timeout", 0 if at_least(version, (0, 18, 0)) else None),
        tensor_parallel_size=stated_tp or ranks_tp or 1,
        tensor_parallel_unknown=stated_tp is None and ranks_tp is None and log is not None and log.parallel_workers,
        quantization=(args.quantization if args is not None else None) or (log.quantization if log else None),
        kv_cache_dtype=(args.kv_cache_dtype if args is not None else None) or (log.kv_cache_dtype if log else None),
        v0_log=log is not None and (log.engine == "v0" or log.cpu_blocks is not None),
        device=log.device if log is not None else None,
        weights_gib=Fact(log.weights_gib, "the model-loading line of the log")
        if log is not None and log.weights_gib is not None
        else None,
        card=card,
    )


def _default_source(args: ServerArgs) -> str:
    """Where a default comes from: a flag absent from vLLM's non-default arguments, or from the command."""
    return LOG_DEFAULT if args.stated_by == STATED_BY_VLLM else f"vLLM's default: not in {args.stated_by}"


def _stated_tensor_parallel(log: LogFacts | None) -> int | None:
    if log is None:
        return None
    return (log.args.tensor_parallel_size if log.args is not None else None) or log.tensor_parallel_size


def _ranks(log: LogFacts | None) -> int | None:
    """GPUs per copy of the model when no argument says it: at least the ranks the log's prefixes name (`rank=5`,
    `[rank5]`, `Worker_TP5`), rounded up to a power of two as tensor parallel sizes are."""
    if log is None or log.ranks_seen is None or log.ranks_seen <= 1:
        return None
    return 1 << (log.ranks_seen - 1).bit_length()


def batch_defaults(version: Version | None, card: GpuDevice | None) -> tuple[int | None, int | None]:
    """vLLM's default (max_num_seqs, max_num_batched_tokens) for the OpenAI server; None where unknowable."""
    if version is None:
        return None, None
    if version < (0, 8, 0):
        return V0_MAX_NUM_SEQS, None  # V0: batched tokens default to max(max_model_len, 2048) without chunked prefill
    if not at_least(version, V1_CARD_DEFAULTS) or card is None:
        return None, None
    if card.memory_total_bytes >= LARGE_CARD_BYTES and "a100" not in (card.name or "").lower():
        return 1024, 8192
    return 256, 2048


def _card(evidence: Evidence) -> GpuDevice | None:
    reading = evidence.gpu.reading
    return reading.devices[0] if reading is not None and reading.devices else None


def _cache_configs(evidence: Evidence) -> list[CacheConfig]:
    reading = evidence.live.reading
    if reading is None:
        return []
    return [engine.cache_config for engine in reading.engines if engine.cache_config is not None]


def _max_model_len(evidence: Evidence, log: LogFacts | None) -> Fact[int] | None:
    if evidence.live.max_model_len is not None:
        return Fact(evidence.live.max_model_len, "GET /v1/models")
    if log is None:
        return None
    if log.refusal is not None and log.refusal.max_model_len is not None:
        return Fact(log.refusal.max_model_len, "vLLM's refusal to start")
    stated = Fact(log.args.max_model_len, log.args.stated_by) if log.args and log.args.max_model_len else None
    logged = Fact(log.max_seq_len, "the engine configuration vLLM logged") if log.max_seq_len else None
    # What vLLM printed wins over a command line, which may not be the one this start ran.
    return (stated or logged) if _vllm_stated(log) else (logged or stated)


def _log_utilization(log: LogFacts | None) -> Fact[float] | None:
    if log is None:
        return None
    stated = (
        Fact(log.args.gpu_memory_utilization, log.args.stated_by)
        if log.args is not None and log.args.gpu_memory_utilization is not None
        else None
    )
    if stated is not None and _vllm_stated(log):
        return stated
    for value, where in (
        (log.refusal.utilization if log.refusal else None, "vLLM's refusal to start"),
        (log.profile.utilization if log.profile else None, log.profile.source if log.profile else ""),
        (log.graphs_charged_utilization, "vLLM's CUDA graph memory profiling line"),
    ):
        if value is not None:
            return Fact(value, where)
    return stated


def _vllm_stated(log: LogFacts) -> bool:
    return log.args is not None and log.args.stated_by == STATED_BY_VLLM


def _pool_tokens(configs: list[CacheConfig], log: LogFacts | None) -> Fact[int] | None:
    sizes: list[int] = []
    for config in configs:
        if config.kv_cache_size_tokens is not None:
            sizes.append(config.kv_cache_size_tokens)
        elif config.num_gpu_blocks_server is not None and config.block_size_tokens is not None:
            sizes.append(config.num_gpu_blocks_server // config.engines_in_server * config.block_size_tokens)
    if sizes:
        return Fact(min(sizes), CACHE_CONFIG)
    if log is not None and log.kv_cache_tokens is not None:
        return Fact(log.kv_cache_tokens, "the KV cache size vLLM logged")
    if log is not None and log.num_gpu_blocks is not None and log.args is not None and log.args.block_size:
        return Fact(log.num_gpu_blocks * log.args.block_size, "the block count vLLM logged")
    return None
