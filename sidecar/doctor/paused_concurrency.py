"""Concurrency misjudgement from the sidecar's own history: the daemon paused admission for KV pressure (its rules
kv_cache_usage, preemptions, waiting_queue), sized from the engine's blocks per request at its last poll. Pure.
"""

from __future__ import annotations

import math
import re

from sidecar.doctor.concurrency import MORE_KV_ROOM, fewer_seqs
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import clock, tokens
from sidecar.doctor.setup import Setup
from sidecar.model.text import plural
from sidecar.policy.settings import PolicySettings

# The policy's pause reasons (sidecar/policy/rules.py `pause_findings`) for KV pressure, one pattern per rule.
_KV_PAUSE = re.compile(r"KV cache usage (?P<usage>[\d.]+) >= (?P<limit>[\d.]+) on (?P<engine>engine \S+)")
_PREEMPTION_PAUSE = re.compile(r"preemptions (?P<rate>[\d.]+)/s > (?P<limit>[\d.]+)/s on (?P<engine>engine \S+)")
_WAITING_PAUSE = re.compile(r"waiting(?: for capacity)? (?P<waiting>[\d.]+).*? > [\d.]+ x running (?P<running>[\d.]+)")
DEFAULT_PAUSE_KV = PolicySettings().pause_kv_usage_ratio  # --pause-kv-usage's, when no pause reason says it


def history_concurrency(evidence: Evidence, setup: Setup) -> Finding | None:
    """The daemon paused admission for KV pressure (its rules kv_cache_usage, preemptions, waiting_queue): more
    requests were admitted than the KV cache holds. Sized from the engine's blocks per request at the daemon's
    last poll: the KV capacity x the pause threshold / blocks per request is the --max-num-seqs that keeps usage
    under the line the daemon pauses at."""
    history = evidence.history
    if history is None or history.policy is None:
        return None
    policy = history.policy
    texts = [
        (event["wall_time_s"], event["reason"]) for event in policy["recent"] if "pause_admission" in event["actions"]
    ]
    if not texts and policy["readiness"].startswith("paused:"):
        texts.append((history.polled_at_s, policy["readiness"]))  # paused before the recent decisions began
    kv = [(when, m) for when, text in texts if (m := _KV_PAUSE.search(text))]
    preempt = [(when, m) for when, text in texts if (m := _PREEMPTION_PAUSE.search(text))]
    queue = [(when, m) for when, text in texts if (m := _WAITING_PAUSE.search(text))]
    if not (kv or preempt or queue):
        return None
    pauses = sum(1 for event in policy["recent"] if "pause_admission" in event["actions"])
    lines = [
        f"the sidecar paused admission {plural(pauses, 'time')} in its recent decisions for KV pressure: "
        + ", ".join(
            f"{name} {len(found)}"
            for name, found in (("kv_cache_usage", kv), ("preemptions", preempt), ("waiting_queue", queue))
            if found
        )
    ]
    for when, match in (kv + preempt + queue)[-4:]:
        lines.append(f"{clock(when) if when is not None else '(time unknown)'}: {match.group(0)}")
    limit = max((float(m.group("limit")) for _, m in kv), default=DEFAULT_PAUSE_KV)
    peak = max((float(m.group("usage")) for _, m in kv), default=None)
    engines = [e for e in history.engines if e["kv_cache_capacity_blocks"] and e["kv_cache_blocks_per_request"]]
    recommendations: list[Recommendation] = []
    if engines:
        engine = max(engines, key=lambda e: e["kv_cache_usage_ratio"] or 0.0)
        capacity, per_request = engine["kv_cache_capacity_blocks"] or 0, engine["kv_cache_blocks_per_request"] or 0.0
        block = engine["kv_cache_block_size_tokens"]
        tokens_text = f" of {block} tokens ({tokens(capacity * block)} tokens)" if block else ""
        usage = engine["kv_cache_usage_ratio"] or 0.0
        lines.append(
            f"{history.engine_label(engine)} at the daemon's last poll: {_number(engine['requests_running'])} "
            "running and "
            f"{_number(engine['requests_waiting'])} waiting, KV usage {usage:.1%} of {capacity:,} blocks{tokens_text}, "
            f"{per_request:,.1f} blocks per running request (kv_cache_blocks_per_request)"
        )
        holds = capacity / per_request
        lines.append(f"the KV cache holds {capacity:,} / {per_request:,.1f} = {holds:,.1f} requests of that size")
        if peak is not None:
            lines.append(f"the fullest pause saw KV usage {peak:.2f} against the pause line {limit:.2f}")
        if engine["preemptions_in_window"]:
            lines.append(
                f"vLLM preempted {plural(engine['preemptions_in_window'], 'request', spec='g')} over the "
                "daemon's window "
                f"(now {engine['preemptions_per_second'] or 0:.2f}/s)"
            )
        value = max(1, math.floor(capacity * limit / per_request))
        recommendations.extend(
            fewer_seqs(
                value,
                setup,
                unknown="max_num_seqs not known here",
                why=lambda now: (
                    f"{capacity:,} blocks x {limit:g} (the daemon's pause line) / {per_request:,.1f} blocks per "
                    f"request = {capacity * limit / per_request:,.1f}, rounded down -> {value} ({now}): at most "
                    "that many run at once, so usage stays under the line instead of pausing and preempting; "
                    "the blocks per request are measured mid-generation, so leave it lower if outputs are long"
                ),
            )
        )
    else:
        lines.append(
            "blocks per request unknown at the daemon's last poll (no request running): --max-num-seqs cannot be "
            "sized from the history; run the doctor with --vllm-url during load"
        )
    lines.append(MORE_KV_ROOM)
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary="the sidecar paused admission for KV pressure: more requests are admitted than the KV cache holds",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"
