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


FLAGS: dict[str, FlagSpan] = {
    span.flag: span
    for span in (
        FlagSpan(flag="--max-model-len", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--max-num-seqs", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--max-num-batched-tokens", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--gpu-memory-utilization", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--block-size", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--tensor-parallel-size", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--quantization", since=None, source="EngineArgs, every release (fp8 since 0.5)"),
        FlagSpan(flag="--kv-cache-dtype", since=None, source="EngineArgs, every release (fp8 since 0.5)"),
        FlagSpan(flag="--enforce-eager", since=None, source="EngineArgs, every release"),
        FlagSpan(flag="--cpu-offload-gb", since=None, source="cache_config_info label since 0.5.4; 0.32.0 parser"),
        FlagSpan(
            flag="--no-enable-prefix-caching",
            since=(0, 8, 0),
            source="V1 (default from 0.8.0) turns prefix caching on; the flag is a BooleanOptionalAction",
        ),
        FlagSpan(flag="--kv-cache-memory-bytes", since=(0, 10, 2), source="CacheConfig.kv_cache_memory_bytes, 0.10.2"),
        FlagSpan(flag="--shutdown-timeout", since=(0, 18, 0), source="VllmConfig.shutdown_timeout, 0.18.0"),
        FlagSpan(flag="--max-num-queued-reqs", since=(0, 32, 0), source="SchedulerConfig.max_num_queued_reqs, 0.32.0"),
        FlagSpan(flag="PYTORCH_CUDA_ALLOC_CONF", since=None, source="PyTorch's caching allocator (torch >= 2.1)"),
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


def available(flag: str, version: Version | None) -> bool:
    """Whether `flag` may be recommended to a vLLM of `version` (None: unknown version)."""
    span = FLAGS.get(flag)
    if span is None:
        raise KeyError(f"{flag} is not in the doctor's version table")
    if span.since is None:
        return True
    return version is not None and version >= span.since


def since_text(flag: str) -> str:
    span = FLAGS[flag]
    return "every release" if span.since is None else ".".join(str(part) for part in span.since)


def at_least(version: Version | None, minimum: Version) -> bool:
    return version is not None and version >= minimum
