"""The sidecar daemon's own history: its /status document or its state directory's restart ledger. Pure.

A document of the wrong shape is a `HistoryError` with one line saying what is wrong, never a crash.
"""

from __future__ import annotations

import math

from sidecar.doctor.evidence import GpuTrend, HistoryFacts
from sidecar.policy.ledger import RestartLedger, RestartLedgerError


class HistoryError(ValueError):
    """The history document is not one the doctor can read."""


def from_status(document: object, source: str) -> HistoryFacts:
    """Facts from the daemon's GET /status JSON."""
    if not isinstance(document, dict) or not isinstance(document.get("engines"), list):
        raise HistoryError(f"{source} is not the sidecar's /status document (no 'engines' list)")
    engines = [engine for engine in document["engines"] if isinstance(engine, dict)]
    gpus = (
        [gpu for gpu in document.get("gpus", []) if isinstance(gpu, dict)]
        if isinstance(document.get("gpus"), list)
        else []
    )
    hit_ratios = [_number(engine.get("prefix_cache_hit_ratio")) for engine in engines]
    preemptions = [_number(engine.get("preemptions_per_second")) for engine in engines]
    trends = tuple(
        GpuTrend(
            gpu=int(index),
            growth_bytes_per_second=_number(gpu.get("memory_growth_bytes_per_second")),
            fit_r2=_number(gpu.get("memory_growth_fit_r2")),
            time_to_oom_s=_number(gpu.get("time_to_oom_seconds")),
        )
        for gpu in gpus
        if isinstance(index := gpu.get("gpu"), int) and not isinstance(index, bool)
    )
    policy = document.get("policy")
    restarts = policy.get("restarts") if isinstance(policy, dict) else None
    counted = (
        tuple(
            (str(reason), int(count))
            for reason, count in sorted(restarts.items())
            if isinstance(count, int) and not isinstance(count, bool) and count > 0
        )
        if isinstance(restarts, dict)
        else ()
    )
    return HistoryFacts(
        source=source,
        prefix_hit_ratio_window=min((v for v in hit_ratios if v is not None), default=None),
        preemptions_per_second=max((v for v in preemptions if v is not None), default=None),
        gpus=trends,
        restarts=counted,
    )


def from_ledger(document: object, source: str) -> HistoryFacts:
    """Facts from the restart ledger the daemon keeps in its --state-dir."""
    try:
        ledger = RestartLedger.from_dict(document)
    except RestartLedgerError as error:
        raise HistoryError(f"{source} is not a restart ledger: {error}") from None
    counts: dict[str, int] = {}
    for record in ledger.records:
        counts[record.reason.value] = counts.get(record.reason.value, 0) + 1
    return HistoryFacts(
        source=source,
        prefix_hit_ratio_window=None,
        preemptions_per_second=None,
        gpus=(),
        restarts=tuple(sorted(counts.items())),
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
