"""Memory leak: the daemon measured GPU memory growing steadily (a least-squares slope with a good fit) or
restarted vLLM on its OOM forecast. vLLM allocates its KV pool once at start, so steady growth after that is not
a budget set too high (that is configuration_overshoot: memory over budget without a trend) but memory that is
never given back. The finding gives the restart cadence the slope forces, what PyTorch's allocator can do about
it, and what to collect for a bug report. Pure.
"""

from __future__ import annotations

import math

from sidecar.doctor.evidence import Evidence, HistoryFacts
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import MIB, clock, duration, gib
from sidecar.doctor.overshoot import ALLOC_CONF, EXPANDABLE, MIN_TREND_R2, URGENT_OOM_S
from sidecar.doctor.setup import Setup
from sidecar.model.status import GpuStatus
from sidecar.model.text import plural

MAX_FRESH_TO_OOM_S = 7 * 86400.0  # slower than a week from a fresh start to a full card: not worth a finding
OOM_FORECAST_S = 900.0  # the daemon's --oom-forecast default: it restarts when the time to OOM stays under this
FORECAST_MIN_UPTIME_S = 600.0  # the daemon's --forecast-min-uptime default: no forecast restart of a younger vLLM
EVENTS_SHOWN = 6


def history_leak(evidence: Evidence, setup: Setup) -> Finding | None:
    history = evidence.history
    if history is None:
        return None
    growing = [trend for trend in history.gpus if leaking(trend)]
    forecast_restarts = dict(history.restarts).get("oom_forecast", 0)
    events = (
        [event for event in history.policy["recent"] if "(oom_forecast)" in event["reason"]]
        if history.policy is not None
        else []
    )
    if not growing and not forecast_restarts and not events:
        return None
    lines: list[str] = []
    steps: list[str] = []
    cadences: list[float] = []
    for trend in growing:
        described, cadence = _describe(trend, history)
        lines.extend(described)
        if cadence is not None:
            cadences.append(cadence)
    if not growing:
        lines.append(
            "no growth trend at the daemon's last poll (the trend starts over after a restart and needs a steady "
            "window of polls): the slope is not known from this document; run the doctor again once it is"
        )
    if forecast_restarts:
        lines.append(
            f"the sidecar restarted vLLM {plural(forecast_restarts, 'time')} on its OOM forecast "
            "(restarts oom_forecast)"
        )
    for event in events[-EVENTS_SHOWN:]:
        when = clock(event["wall_time_s"]) if event["wall_time_s"] is not None else "(time unknown)"
        lines.append(
            f"{when} the policy: {', '.join(event['actions']) or 'no action'} ({event['state']}): {event['reason']}"
        )
    if cadences:
        steps.extend(_restart_steps(min(cadences)))
    steps.extend(_collect(history, growing, setup))
    urgent = any(
        trend["time_to_oom_seconds"] is not None and trend["time_to_oom_seconds"] < URGENT_OOM_S for trend in growing
    )
    return Finding(
        cause=Cause.MEMORY_LEAK,
        severity=Severity.CRITICAL if urgent else Severity.WARNING,
        summary=(
            "GPU memory grows steadily while vLLM serves: memory is not given back (a leak), not a budget set too high"
            if growing
            else "the sidecar acted on its OOM forecast: GPU memory grew until a planned restart was due"
        ),
        evidence=tuple(lines),
        recommendations=(
            Recommendation(
                flag=ALLOC_CONF,
                value=EXPANDABLE,
                why=(
                    "if the growth is PyTorch's cache (reserved but not allocated) rather than live tensors, "
                    "expandable segments let the caching allocator reuse and grow segments instead of stranding "
                    "them, which slows or stops the growth; it does not fix live tensors that are never freed "
                    "(the allocator probe below tells which)"
                ),
            ),
        ),
        steps=tuple(steps),
    )


def leaking(trend: GpuStatus) -> bool:
    """A steady growth of vLLM's memory: positive slope, a fit the daemon trusts, fast enough to matter, and not
    another process's (with another tenant on the card and vLLM inside its budget the growth may be the tenant's,
    which is configuration_overshoot)."""
    growth, fit = trend["memory_growth_bytes_per_second"], trend["memory_growth_fit_r2"]
    if growth is None or growth <= 0 or fit is None or fit < MIN_TREND_R2:
        return False
    if trend["other_process_memory_bytes"] and (
        trend["vllm_process_memory_bytes"] is None
        or trend["memory_budget_bytes"] is None
        or trend["vllm_process_memory_bytes"] <= trend["memory_budget_bytes"]
    ):
        return False
    fresh = _fresh_to_full_s(trend)
    if trend["time_to_oom_seconds"] is not None:
        return True
    return fresh is not None and fresh <= MAX_FRESH_TO_OOM_S


def _fresh_to_full_s(trend: GpuStatus) -> float | None:
    """Seconds from a fresh vLLM (holding its budget) until the card is full, at this slope."""
    growth = trend["memory_growth_bytes_per_second"]
    if growth is None or growth <= 0 or trend["memory_total_bytes"] is None:
        return None
    start = trend["memory_budget_bytes"] if trend["memory_budget_bytes"] is not None else trend["memory_used_bytes"]
    if start is None:
        return None
    return max(0.0, (trend["memory_total_bytes"] - start) / growth)


def _describe(trend: GpuStatus, history: HistoryFacts) -> tuple[list[str], float | None]:
    growth = trend["memory_growth_bytes_per_second"] or 0.0
    name = f" ({trend['name']})" if trend["name"] else ""
    lines = [
        f"GPU {trend['gpu']}{name} memory grows {growth / MIB:,.2f} MiB/s = {growth * 3600 / 2**30:,.2f} GiB/h "
        f"(least-squares slope over the daemon's --memory-trend-window, R² {trend['memory_growth_fit_r2']:.3f})"
    ]
    if trend["memory_used_bytes"] is not None and trend["memory_total_bytes"] is not None:
        budget = (
            f", vLLM's budget {gib(trend['memory_budget_bytes'])}" if trend["memory_budget_bytes"] is not None else ""
        )
        over = (
            f" ({gib(trend['memory_used_bytes'] - trend['memory_budget_bytes'])} beyond it)"
            if trend["memory_budget_bytes"] is not None and trend["memory_used_bytes"] > trend["memory_budget_bytes"]
            else ""
        )
        lines.append(
            f"GPU {trend['gpu']}: {gib(trend['memory_used_bytes'])} used of "
            f"{gib(trend['memory_total_bytes'])}{budget}{over}"
        )
    if trend["time_to_oom_seconds"] is not None:
        when = (
            f", at {clock(history.polled_at_s + trend['time_to_oom_seconds'])}"
            if history.polled_at_s is not None
            else ""
        )
        lines.append(
            f"the daemon forecasts the card full in {duration(trend['time_to_oom_seconds'])}{when} "
            "(time_to_oom_seconds)"
        )
    fresh = _fresh_to_full_s(trend)
    if fresh is None or trend["memory_total_bytes"] is None:
        return lines, None
    start = (
        trend["memory_budget_bytes"] if trend["memory_budget_bytes"] is not None else trend["memory_used_bytes"] or 0
    )
    what = "its budget" if trend["memory_budget_bytes"] is not None else "today's use (its budget unknown)"
    cadence = fresh - OOM_FORECAST_S
    lines.append(
        f"restart cadence: a fresh vLLM holds {what}, {gib(start)}; ({gib(trend['memory_total_bytes'])} - "
        f"{gib(start)}) / "
        f"{growth / MIB:,.2f} MiB/s = {duration(fresh)} until the card is full; the sidecar restarts "
        f"{duration(OOM_FORECAST_S)} before that (--oom-forecast default): "
        + (
            f"a planned restart every {duration(cadence)}, {math.ceil(3600 / cadence) if cadence > 0 else 0} per "
            f"hour at most, {86400 / cadence:,.1f} a day"
            if cadence > 0
            else "no room for a planned restart at all"
        )
    )
    return lines, cadence


def _restart_steps(cadence_s: float) -> list[str]:
    if cadence_s < FORECAST_MIN_UPTIME_S:
        when = f"every {duration(cadence_s)}" if cadence_s > 0 else "sooner than the forecast can warn"
        return [
            f"a planned restart would be due {when}, before the sidecar's --forecast-min-uptime "
            f"({duration(FORECAST_MIN_UPTIME_S)} by default) lets it restart: restarts cannot carry this leak; find "
            "its cause (below) or go back to the vLLM version or flags before it began"
        ]
    per_hour = math.ceil(3600 / cadence_s)
    return [
        f"until it is fixed, let the sidecar restart vLLM in a planned way (--actuator systemd, kubernetes or exec): "
        f"one drain and restart every {duration(cadence_s)}; --max-restarts-per-hour must allow at least "
        f"{per_hour} (default 3)"
    ]


def _collect(history: HistoryFacts, growing: list[GpuStatus], setup: Setup) -> list[str]:
    version = setup.version_text or history.vllm_version or "unknown"
    slopes = ", ".join(
        f"GPU {t['gpu']} {(t['memory_growth_bytes_per_second'] or 0.0) / MIB:,.2f} MiB/s R² "
        f"{t['memory_growth_fit_r2']:.3f}"
        for t in growing
    )
    return [
        "the sidecar's allocator probe (VLLM_SIDECAR_PROBE_DIR in vLLM's environment, --probe-dir for the daemon): "
        "vllm_sidecar_torch_allocated_bytes growing means live tensors are kept (a leak to report); reserved "
        "growing with allocated flat means PyTorch's cache (expandable_segments)",
        "in the engine process: torch.cuda.memory._record_memory_history(max_entries=100000) at start, then "
        "torch.cuda.memory._dump_snapshot('vllm-mem.pickle') after an hour of growth (or "
        "torch.cuda.memory_snapshot()); "
        "pytorch.org/memory_viz shows the stack of every allocation that stays",
        "whether it grows per request or per second: compare the slope with vllm:request_success_total's rate over "
        "the same window, and note the traffic mix (long prompts, LoRA adapters, multimodal inputs, structured output)",
        f"for the bug report: vLLM {version} and its full flags (the 'non-default args' line), torch and driver "
        f"versions, the slope and R² ({slopes or 'from the next window'}) with the window, the memory snapshot, and "
        "per-process GPU memory over time (/status gpus[].processes)",
    ]
