"""What a diagnosis says: findings by root cause, each with its evidence and recommended flags. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Cause(StrEnum):
    CONFIGURATION_OVERSHOOT = "configuration_overshoot"
    KV_CACHE_BLOWOUT = "kv_cache_blowout"
    CONCURRENCY_MISJUDGEMENT = "concurrency_misjudgement"
    DOES_NOT_FIT = "does_not_fit"
    ALLOCATOR_FRAGMENTATION = "allocator_fragmentation"
    ENGINE_HANG = "engine_hang"
    MEMORY_LEAK = "memory_leak"
    OTHER = "other"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """One flag (or environment variable, or pod field) and its value, ready to paste, with the arithmetic."""

    flag: str
    value: int | float | str  # "" for a switch that takes no value (e.g. --enforce-eager)
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    cause: Cause
    severity: Severity
    summary: str
    evidence: tuple[str, ...]
    recommendations: tuple[Recommendation, ...] = ()
    steps: tuple[str, ...] = ()  # what to do or collect that is no flag (a py-spy dump, a bug report's contents)


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    version: str | None
    reachable: bool
    url: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]  # what was read, what was missing and what that leaves unchecked
    diagnosable: bool  # False: nothing readable (vLLM unreachable and no usable log)
    reason: str | None = None  # one line when not diagnosable
