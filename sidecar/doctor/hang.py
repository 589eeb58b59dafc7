"""Engine hang: the sidecar daemon saw an engine stop making progress, paused for it, probed it or restarted it.

vLLM's /health stays 200 through a hang (the API server answers; the engine loop does not), so only the daemon's
history shows one: its engines' stall clocks, the policy's pauses and restarts that say "made no progress", and
the engine probe's unanswered completions. The finding gives the timeline and what to collect while it hangs
(py-spy of the engine loop) and the timeouts that turn a silent hang into a death vLLM reports. Pure.
"""

from __future__ import annotations

from sidecar.doctor.evidence import Evidence, HistoryFacts, counted
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import clock
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import Version, at_least, available
from sidecar.model.status import EngineStatus, RecentDecision
from sidecar.model.text import plural

# What the policy's reasons say about a hang (sidecar/policy/rules.py, probe.py and machine.py word them so).
HANG_WORDS = ("made no progress", "probe completion got no answer", "(engine_hung)", "engine hung")
MIN_STALL_S = 60.0  # with work and no progress this long it is a hang even if the policy never acted (runbook alert)
EXECUTE_MODEL_TIMEOUT_S = 120  # the sidecar's --hung-after default: vLLM should give up on a worker no later
EVENTS_SHOWN = 8


def history_hang(evidence: Evidence, setup: Setup) -> Finding | None:
    history = evidence.history
    if history is None:
        return None
    policy = history.policy
    events = [event for event in policy["recent"] if _about_hang(event["reason"])] if policy is not None else []
    restarts = dict(history.restarts).get("engine_hung", 0)
    unanswered = policy["probes"].get("no_answer", 0) if policy is not None else 0
    # Acting on it now: a stall the policy only watches (state pressure, under --stall-pause-after) is not a hang yet.
    current = (
        policy is not None
        and policy["state"] not in ("normal", "pressure", "starting")
        and any(_about_hang(text) for text in (policy["reason"], policy["readiness"]))
    )
    stalled = [engine for engine in history.engines if (engine["engine_stalled_seconds"] or 0.0) > 0]
    long_stall = any((engine["engine_stalled_seconds"] or 0.0) >= MIN_STALL_S for engine in stalled)
    if not (events or restarts or unanswered or current or long_stall):
        return None
    lines = _timeline(history, stalled, events, current=current)
    if unanswered:
        answers = ", ".join(f"{outcome} {count}" for outcome, count in counted(policy["probes"])) if policy else ""
        last = f" (last: {policy['last_probe']})" if policy is not None and policy["last_probe"] else ""
        lines.append(f"the daemon's 1-token probe completions: {answers}{last}")
    if restarts:
        lines.append(f"the sidecar restarted vLLM {plural(restarts, 'time')} for a hang (restarts engine_hung)")
        onset = _onset(history, stalled)
        last_restart = policy["last_restart_timestamp_seconds"] if policy is not None else None
        if onset is not None and last_restart is not None and onset >= last_restart:
            lines.append(
                f"the engine stopped again after the last restart ({clock(last_restart)}): the hang comes back, "
                "a bug to report rather than load to shed"
            )
    if policy is not None and policy["would_restart_but"] and _about_hang(policy["reason"]):
        lines.append(f"a further restart is held: {policy['would_restart_but']}")
    if history.vllm_healthy:
        lines.append("vLLM's /health answered 200 at the daemon's last poll: a hang /health cannot show")
    severity = Severity.CRITICAL if current or long_stall else Severity.WARNING
    what = "is stalled now" if current or long_stall else "stalled"
    return Finding(
        cause=Cause.ENGINE_HANG,
        severity=severity,
        summary=f"a vLLM engine {what}: it made no progress, which /health does not show"
        + (f"; restarted {plural(restarts, 'time')}" if restarts else ""),
        evidence=tuple(lines),
        recommendations=tuple(_recommendations(setup.version)),
        steps=tuple(_steps(setup.version, probed=bool(counted(policy["probes"])) if policy else False)),
    )


def _about_hang(text: str) -> bool:
    return any(word in text for word in HANG_WORDS)


def _onset(history: HistoryFacts, stalled: list[EngineStatus]) -> float | None:
    """When the longest stall began, from the daemon's last poll and the engine's stall clock."""
    if history.polled_at_s is None:
        return None
    quiet = [engine["engine_stalled_seconds"] or engine["seconds_since_progress"] or 0.0 for engine in stalled]
    return history.polled_at_s - max(quiet) if quiet else None


def _timeline(
    history: HistoryFacts, stalled: list[EngineStatus], events: list[RecentDecision], *, current: bool
) -> list[str]:
    lines: list[str] = []
    polled = history.polled_at_s
    at = f" at {clock(polled)}" if polled is not None else ""
    for engine in stalled:
        quiet = engine["engine_stalled_seconds"] or 0.0
        since = f"since {clock(polled - quiet)}, " if polled is not None else ""
        work = f"{_requests(engine['requests_running'])} running and {_count(engine['requests_waiting'])} waiting"
        lines.append(
            f"{history.engine_label(engine)}: no progress {since}{quiet:,.0f} s before the daemon's last "
            f"poll{at}, with {work} "
            "(engine_stalled_seconds)"
        )
    if not stalled and current:
        quiet_engines = [engine for engine in history.engines if (engine["seconds_since_progress"] or 0.0) > 0]
        for engine in quiet_engines:
            quiet = engine["seconds_since_progress"] or 0.0
            since = f"since {clock(polled - quiet)}, " if polled is not None else ""
            lines.append(
                f"{history.engine_label(engine)}: no progress at all {since}{quiet:,.0f} s before the last "
                f"poll{at}, while it reads "
                "idle (seconds_since_progress): a wedge only a request shows"
            )
    for event in events[-EVENTS_SHOWN:]:
        when = clock(event["wall_time_s"]) if event["wall_time_s"] is not None else "(time unknown)"
        lines.append(
            f"{when} the policy: {', '.join(event['actions']) or 'no action'} ({event['state']}): {event['reason']}"
        )
    hidden = len(events) - EVENTS_SHOWN
    if hidden > 0:
        lines.append(f"({hidden} earlier hang decisions not shown)")
    if current and history.policy is not None:
        lines.append(f"now ({history.policy['state']}): {history.policy['reason']}")
    return lines


def _requests(value: float | None) -> str:
    return "? requests" if value is None else plural(value, "request", spec="g")


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _recommendations(version: Version | None) -> list[Recommendation]:
    recommendations: list[Recommendation] = []
    if version is not None and version < (0, 8, 0):
        recommendations.append(
            Recommendation(
                flag="VLLM_ENGINE_ITERATION_TIMEOUT_S",
                value=60,
                why=(
                    "V0's AsyncLLMEngine gives up on an engine step after this many seconds (its default, 60; "
                    "vllm/engine/async_llm_engine.py 0.5-0.10) and the engine dies, which /health shows and the "
                    "sidecar restarts after --dead-after; keep it at 60 or lower, never raised to hide a hang"
                ),
            )
        )
    if at_least(version, (0, 10, 0)) and available("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", version):
        recommendations.append(
            Recommendation(
                flag="VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
                value=EXECUTE_MODEL_TIMEOUT_S,
                why=(
                    f"with tensor or pipeline parallel workers (the multiprocessing executor) vLLM waits this long "
                    f"for a worker's step (default 300 s, vLLM 0.10+); {EXECUTE_MODEL_TIMEOUT_S} s, the sidecar's "
                    "--hung-after default, makes a wedged worker fail the engine with a traceback naming it, "
                    "instead of a silent stall"
                ),
            )
        )
    return recommendations


def _steps(version: Version | None, *, probed: bool) -> list[str]:
    v1 = version is None or version >= (0, 8, 0)
    process = "the EngineCore process (pgrep -f 'VLLM::EngineCore')" if v1 else "the vLLM API server process"
    steps = [
        f"while it hangs: py-spy dump --pid <pid of {process}> --native, two or three times 10 s apart (the "
        "engine loop's stack says where it waits: a CUDA or NCCL call, a lock, the scheduler)",
        "with tensor parallel: py-spy dump every worker too (pgrep -f VllmWorker), and restart vLLM once with "
        "NCCL_DEBUG=INFO if a worker waits in NCCL",
        "nvidia-smi during the hang: GPUs busy at 100 % point at a kernel or collective that never ends, idle "
        "GPUs at a Python-side deadlock",
        "for the bug report: vLLM version and flags, the py-spy dumps, vLLM's log around the time the engine "
        "stopped (above), and this /status document",
    ]
    if version is not None and (0, 8, 0) <= version < (0, 11, 0):
        steps.append(
            "if this vLLM runs the V0 engine (VLLM_USE_V1=0): VLLM_ENGINE_ITERATION_TIMEOUT_S (default 60) "
            "ends a stuck step; V1 does not read it"
        )
    steps.append(
        "the sidecar restarts a hang after --hung-after (default 120 s) without progress; lower it to shorten "
        "each outage (a step is never that slow)"
    )
    if not probed:
        steps.append(
            "the engine probe never ran: keep --probe-after on (default 60 s, 0 turns it off) so an engine that "
            "wedges while idle is caught before traffic arrives"
        )
    return steps
