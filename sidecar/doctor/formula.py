"""The arithmetic behind every recommended value, each returning the value and the sentence that shows it. Pure.

Thresholds and margins are named here and explained in docs/doctor.md ("Formulas").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sidecar.model.text import plural

GIB = 2**30
MIB = 2**20
MAX_MODEL_LEN_MULTIPLE = 256
RESERVE_RATIO = 0.05  # free memory kept beside vLLM: the sidecar's own --min-gpu-free default
KV_HEADROOM_RATIO = 0.9  # share of the KV pool max_num_seqs may plan for; the rest absorbs decode growth
GRAPH_MARGIN_RATIO = 0.01  # extra utilisation given up after an OOM during CUDA-graph capture
SHUTDOWN_STEP_S = 10
GRACE_TEARDOWN_S = 30  # after the drain: the engine, workers and the API server shut down
LARGE_CARD_BYTES = 70 * GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class Computed:
    value: int | float
    why: str


def tokens(value: float) -> str:
    return f"{value:,.0f}"


def gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:.2f} GiB"


def clock(wall_time_s: float) -> str:
    """A wall-clock time for a timeline line, in UTC (the daemon's /status gives epoch seconds)."""
    return datetime.fromtimestamp(wall_time_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """A span for a human: 45 s, 12.5 min, 3.2 h, 2.1 days."""
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86400:,.1f} days"


def ratio(value: float) -> str:
    return f"{value:.1%}"


def round_up(value: float, multiple: int) -> int:
    """The next multiple at or above `value`, at least one multiple (the epsilon keeps 2048.0 at 2048)."""
    return max(1, math.ceil(value / multiple - 1e-9)) * multiple


def floor_hundredths(value: float) -> float:
    """Round down to 0.01; the epsilon keeps 0.87 from becoming 0.86 through binary floating point."""
    return math.floor(value * 100 + 1e-6) / 100


def max_model_len(p99_prompt: float, p99_output: float, requests: int, source: str) -> Computed:
    """Room for the p99 prompt plus the p99 output, rounded up to a multiple of 256 tokens."""
    needed = p99_prompt + p99_output
    value = round_up(needed, MAX_MODEL_LEN_MULTIPLE)
    return Computed(
        value=value,
        why=(
            f"p99 prompt {tokens(p99_prompt)} + p99 output {tokens(p99_output)} = {tokens(needed)} tokens "
            f"({source}, {plural(requests, 'request', spec=',')}; bucket upper bounds) rounded up to a multiple of "
            f"{MAX_MODEL_LEN_MULTIPLE} -> {value}"
        ),
    )


def max_num_seqs(pool_tokens: int, mean_tokens: float, requests: int) -> Computed:
    """How many requests of today's mean size fit in 90 % of the KV pool."""
    usable = pool_tokens * KV_HEADROOM_RATIO
    mean_tokens = max(1.0, mean_tokens)  # a request holds at least one token (a histogram's sum can say less)
    value = max(1, math.floor(usable / mean_tokens))
    return Computed(
        value=value,
        why=(
            f"KV pool {tokens(pool_tokens)} tokens x {KV_HEADROOM_RATIO:g} headroom = {tokens(usable)} tokens / "
            f"mean {mean_tokens:,.1f} tokens per request (prompt + output, {plural(requests, 'request', spec=',')}) "
            f"= {usable / mean_tokens:,.2f}, rounded down -> {value}"
        ),
    )


def utilization(total_bytes: int, others_bytes: int, over_budget_bytes: int) -> Computed:
    """The share of the card vLLM may budget so that other tenants, its own overshoot and 5 % stay free."""
    reserve = total_bytes * RESERVE_RATIO
    usable = total_bytes - others_bytes - over_budget_bytes - reserve
    value = floor_hundredths(usable / total_bytes)
    parts = [gib(total_bytes)]
    if others_bytes:
        parts.append(f"{gib(others_bytes)} other processes")
    if over_budget_bytes:
        parts.append(f"{gib(over_budget_bytes)} vLLM uses beyond its budget")
    parts.append(f"{gib(reserve)} reserve ({RESERVE_RATIO:.0%})")
    return Computed(
        value=value,
        why=f"({' - '.join(parts)}) / {gib(total_bytes)} = {usable / total_bytes:.4f}, rounded down -> {value:.2f}",
    )


def utilization_for_transient(current: float, source: str, tried: int, shortfall: int, total_bytes: int) -> Computed:
    """Lower the budget by what a failed transient allocation lacked, plus 1 % of the card."""
    value = floor_hundredths(current - shortfall / total_bytes - GRAPH_MARGIN_RATIO)
    return Computed(
        value=value,
        why=(
            f"{current:g} ({source}) - {gib(shortfall)} the {gib(tried)} allocation lacked / {gib(total_bytes)} - "
            f"{GRAPH_MARGIN_RATIO:.0%} margin = {current - shortfall / total_bytes - GRAPH_MARGIN_RATIO:.4f}, rounded "
            f"down -> {value:.2f} (the KV cache gives the transient that room; if you set another value U, use "
            f"U - {shortfall / total_bytes + GRAPH_MARGIN_RATIO:.3f})"
        ),
    )


def card_batched_tokens(total_bytes: int, name: str | None) -> Computed:
    """vLLM's own default for the OpenAI server by card size: 8192 on >= 70 GiB cards except A100, else 2048."""
    large = total_bytes >= LARGE_CARD_BYTES and "a100" not in (name or "").lower()
    value = 8192 if large else 2048
    card = f"{name or 'GPU'} with {gib(total_bytes)}"
    rule = ">= 70 GiB and not an A100" if large else "< 70 GiB or an A100"
    return Computed(value=value, why=f"vLLM's default for a {card} ({rule}) is {value}")


def shutdown_timeout(p99_latency_s: float | None, requests: int) -> Computed:
    """Long enough for the p99 request to finish, in steps of 10 s."""
    if p99_latency_s is None:
        return Computed(
            value=120, why="no end-to-end latency histogram: the sidecar's own --drain-timeout default, 120 s"
        )
    value = max(SHUTDOWN_STEP_S, round_up(p99_latency_s, SHUTDOWN_STEP_S))
    return Computed(
        value=value,
        why=(
            f"p99 end-to-end latency <= {p99_latency_s:g} s (vllm:e2e_request_latency_seconds, {requests:,} "
            f"requests) rounded up to {SHUTDOWN_STEP_S} s steps -> {value}: in-flight requests finish instead of "
            "being aborted on SIGTERM"
        ),
    )


def grace_period(shutdown_s: int) -> Computed:
    value = shutdown_s + GRACE_TEARDOWN_S
    return Computed(
        value=value,
        why=f"--shutdown-timeout {shutdown_s} s + {GRACE_TEARDOWN_S} s for the engine and server to exit -> {value}",
    )
