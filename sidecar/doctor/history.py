"""The sidecar daemon's own history: its /status document or its state directory's restart ledger. Pure.

A document of the wrong shape is a `HistoryError` with one line saying what is wrong, never a crash.
"""

from __future__ import annotations

import math

from sidecar.doctor.evidence import (
    AllocatorHistory,
    EngineHistory,
    GpuTrend,
    HistoryFacts,
    PolicyEvent,
    PolicyHistory,
)
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
            total_bytes=_integer(gpu.get("memory_total_bytes")),
            used_bytes=_integer(gpu.get("memory_used_bytes")),
            budget_bytes=_integer(gpu.get("memory_budget_bytes")),
            vllm_bytes=_integer(gpu.get("vllm_process_memory_bytes")),
            other_bytes=_integer(gpu.get("other_process_memory_bytes")),
            name=gpu.get("name") if isinstance(gpu.get("name"), str) else None,
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
    sidecar = document.get("sidecar")
    vllm = document.get("vllm")
    return HistoryFacts(
        source=source,
        prefix_hit_ratio_window=min((v for v in hit_ratios if v is not None), default=None),
        preemptions_per_second=max((v for v in preemptions if v is not None), default=None),
        gpus=trends,
        restarts=counted,
        polled_at_s=_number(sidecar.get("last_poll_timestamp_seconds")) if isinstance(sidecar, dict) else None,
        vllm_version=_text(vllm.get("version")) if isinstance(vllm, dict) else None,
        vllm_healthy=vllm.get("healthy") if isinstance(vllm, dict) and isinstance(vllm.get("healthy"), bool) else None,
        engines=_engines(engines),
        policy=_policy(policy, counted) if isinstance(policy, dict) else None,
        allocators=_allocators(document.get("allocators")),
    )


def _allocators(entries: object) -> tuple[AllocatorHistory, ...]:
    """The allocator probe's values per GPU and rank; an entry missing a number is left out."""
    if not isinstance(entries, list):
        return ()
    found: list[AllocatorHistory] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        gpu, reserved = _integer(entry.get("gpu")), _integer(entry.get("reserved_bytes"))
        split, retries = _integer(entry.get("inactive_split_bytes")), _integer(entry.get("alloc_retries_total"))
        ooms = _integer(entry.get("ooms_total"))
        if gpu is None or reserved is None or split is None or retries is None or ooms is None:
            continue
        rank = entry.get("rank")
        found.append(
            AllocatorHistory(
                gpu=gpu,
                rank=rank if isinstance(rank, str) else "none",
                reserved_bytes=reserved,
                inactive_split_bytes=split,
                alloc_retries_total=retries,
                ooms_total=ooms,
            )
        )
    return tuple(found)


def _engines(engines: list[dict[str, object]]) -> tuple[EngineHistory, ...]:
    several = len({engine.get("model_name") for engine in engines}) > 1
    return tuple(
        EngineHistory(
            label=f"engine {engine.get('model_name')}/{engine.get('engine')}"
            if several
            else f"engine {engine.get('engine')}",
            stalled_s=_number(engine.get("engine_stalled_seconds")),
            since_progress_s=_number(engine.get("seconds_since_progress")),
            running=_number(engine.get("requests_running")),
            waiting=_number(engine.get("requests_waiting")),
            kv_usage=_number(engine.get("kv_cache_usage_ratio")),
            capacity_blocks=_integer(engine.get("kv_cache_capacity_blocks")),
            block_size=_integer(engine.get("kv_cache_block_size_tokens")),
            blocks_per_request=_number(engine.get("kv_cache_blocks_per_request")),
            preemptions_per_second=_number(engine.get("preemptions_per_second")),
            preemptions_in_window=_number(engine.get("preemptions_in_window")),
        )
        for engine in engines
    )


def _policy(policy: dict[str, object], restarts: tuple[tuple[str, int], ...]) -> PolicyHistory:
    recent = policy.get("recent")
    probes = policy.get("probes")
    return PolicyHistory(
        state=_text(policy.get("state")),
        reason=_text(policy.get("reason")),
        readiness=_text(policy.get("readiness")),
        would_restart_but=_text(policy.get("would_restart_but")),
        restarts=restarts,
        recent=tuple(
            PolicyEvent(
                wall_time_s=_number(event.get("wall_time_s")),
                state=_text(event.get("state")) or "",
                actions=tuple(str(a) for a in actions) if isinstance(actions := event.get("actions"), list) else (),
                reason=_text(event.get("reason")) or "",
            )
            for event in (recent if isinstance(recent, list) else [])
            if isinstance(event, dict)
        ),
        probes=tuple(
            (str(outcome), count)
            for outcome, count in sorted(probes.items())
            if isinstance(count, int) and not isinstance(count, bool) and count > 0
        )
        if isinstance(probes, dict)
        else (),
        last_probe=_text(policy.get("last_probe")),
        last_restart_wall_time_s=_number(policy.get("last_restart_timestamp_seconds")),
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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _integer(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
