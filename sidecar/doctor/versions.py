"""Which vLLM release first has each flag the doctor may recommend, and version parsing. Pure.

A flag whose first release is later than the detected version is never recommended; with no version known,
only the flags every release since 0.5.4 has are. Sources are in docs/doctor.md ("Version table").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagSpan:
    flag: str
    since: Version | None  # None: in every release since 0.5.4 (the oldest the sidecar reads)
    source: str
    until: Version | None = None  # the first release without it (None: still in the newest checked)


# Checked against vLLM's own argument parser (vllm/engine/arg_utils.py) and envs.py of every release from 0.7.3 to
# 0.33.0 and of 0.5.4 and 0.6.6 (`pip download --no-deps vllm==X`); docs/doctor.md ("Version table") lists them.
CHECKED = "0.5.4, 0.6.6, 0.7.3 to 0.33.0"
V0_REMOVED: Version = (0, 11, 0)  # the first release without V0's engine (vllm-project/vllm #25033 and its kin)


FLAGS: dict[str, FlagSpan] = {
    span.flag: span
    for span in (
        FlagSpan(flag="--max-model-len", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--max-num-seqs", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--max-num-batched-tokens", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--gpu-memory-utilization", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--block-size", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--tensor-parallel-size", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--pipeline-parallel-size", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--quantization", since=None, source="EngineArgs, every release checked (fp8 since 0.5)"),
        FlagSpan(flag="--dtype", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--kv-cache-dtype", since=None, source="EngineArgs, every release checked (fp8 since 0.5)"),
        FlagSpan(flag="--enforce-eager", since=None, source="EngineArgs, every release checked"),
        FlagSpan(flag="--cpu-offload-gb", since=None, source="EngineArgs, every release checked (0.5.4 on)"),
        FlagSpan(
            flag="--swap-space",
            since=None,
            until=(0, 18, 0),
            source="EngineArgs.swap_space to 0.17.1, gone in 0.18.0 (vllm-project/vllm #36216; V1 never allocates it)",
        ),
        FlagSpan(
            flag="--no-enable-prefix-caching",
            since=(0, 8, 0),
            source="a BooleanOptionalAction from 0.6 (0.5.4 has only --enable-prefix-caching); only worth saying "
            "where V1 turns prefix caching on by default, 0.8.0 on",
        ),
        FlagSpan(flag="--kv-cache-memory-bytes", since=(0, 10, 2), source="CacheConfig.kv_cache_memory_bytes, 0.10.2"),
        FlagSpan(flag="--shutdown-timeout", since=(0, 18, 0), source="VllmConfig.shutdown_timeout, 0.18.0"),
        # 0.29.0's parser has it (SchedulerConfig.max_num_queued_reqs); it caps running + waiting, not waiting alone.
        FlagSpan(flag="--max-num-queued-reqs", since=(0, 29, 0), source="SchedulerConfig.max_num_queued_reqs, 0.29.0"),
        # The CUDA-graph capture sizes, under three spellings (see `graph_sizes_flag`).
        FlagSpan(
            flag="--compilation-config",
            since=(0, 6, 6),
            source="CompilationConfig.cudagraph_capture_sizes (JSON); not in 0.5.4, in 0.6.6 (first 0.6.x not checked)",
        ),
        FlagSpan(
            flag="--cuda-graph-sizes",
            since=(0, 9, 0),
            until=(0, 13, 0),
            source="SchedulerConfig.cuda_graph_sizes 0.9.0-0.12.0 (deprecated in 0.12.0, gone in 0.13.0)",
        ),
        FlagSpan(
            flag="--max-cudagraph-capture-size",
            since=(0, 11, 2),
            source="CompilationConfig.max_cudagraph_capture_size, 0.11.2 on",
        ),
        FlagSpan(flag="PYTORCH_CUDA_ALLOC_CONF", since=None, source="PyTorch's caching allocator (torch >= 2.1)"),
        FlagSpan(flag="PYTORCH_NPU_ALLOC_CONF", since=None, source="torch_npu's caching allocator (Ascend NPUs)"),
        FlagSpan(
            flag="VLLM_METAL_MEMORY_FRACTION",
            since=None,
            source="vllm-metal's budget in the releases whose refusal names it (the plugin, not vLLM)",
        ),
        FlagSpan(
            flag="VLLM_CPU_KVCACHE_SPACE", since=None, source="the CPU backend's KV cache in GiB (vllm/envs.py 0.5.4+)"
        ),
        FlagSpan(
            flag="VLLM_ENGINE_ITERATION_TIMEOUT_S",
            since=None,
            until=(0, 11, 0),
            source="envs.py 0.5.4-0.31.0, read only by V0's AsyncLLMEngine (gone with V0 in 0.11.0)",
        ),
        FlagSpan(
            flag="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
            since=(0, 10, 0),
            source="envs.py 0.10.0 on, the V1 multiprocessing executor's wait for a worker's step (default 300)",
        ),
        FlagSpan(flag="terminationGracePeriodSeconds", since=None, source="Kubernetes pod spec"),
    )
}


def parse_version(text: str | None) -> Version | None:
    """(major, minor, patch) of a vLLM version string such as 0.32.0, 0.8.5.post1 or 0.10.2rc1; None otherwise."""
    if not text:
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def available(flag: str, version: Version | None, *, v0_log: bool = False) -> bool:
    """Whether `flag` may be recommended to a vLLM of `version` (None: unknown version); `v0_log`: the log shows
    V0's engine, so the version, if unknown, is older than V0's removal."""
    span = FLAGS.get(flag)
    if span is None:
        raise KeyError(f"{flag} is not in the doctor's version table")
    if span.until is not None and version is None and v0_log and span.since is None and span.until > V0_REMOVED:
        return True  # in every release up to the last with V0, which this log's vLLM is one of
    if span.until is not None and (version is None or version >= span.until):
        return False  # gone from newer releases: only said to a version known to have it
    if span.since is None:
        return True
    return version is not None and version >= span.since


def graph_sizes_flag(version: Version | None) -> str | None:
    """How this vLLM is told to capture fewer CUDA-graph batch sizes: --max-cudagraph-capture-size (0.11.2+),
    --cuda-graph-sizes (0.9.0-0.12.0), --compilation-config's cudagraph_capture_sizes (0.6.6+); None before
    (V0 captures batch sizes up to max_num_seqs: lower --max-num-seqs) or with the version unknown."""
    for flag in ("--max-cudagraph-capture-size", "--cuda-graph-sizes", "--compilation-config"):
        if version is not None and FLAGS[flag].since is not None and available(flag, version):
            return flag
    return None


def since_text(flag: str) -> str:
    span = FLAGS[flag]
    return "every release" if span.since is None else ".".join(str(part) for part in span.since)


def at_least(version: Version | None, minimum: Version) -> bool:
    return version is not None and version >= minimum
