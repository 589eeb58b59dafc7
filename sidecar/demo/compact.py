"""The demo's one-line readings of the daemon's /status, for a small terminal: the policy's decision, the
problems, each GPU and each engine. Pure: data in, rich Text out. A value the daemon does not know reads "-".
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text

from sidecar.demo.view import GIB, MIB, STATE_STYLES, duration, number

# States in which the policy acts on a condition: the problems line names it.
_ACTING = frozenset({"pressure", "paused", "draining", "restarting", "failed"})


def decision(policy: Mapping[str, object] | None) -> Text:
    """The policy's state and admission, why, and the restart a guard holds back (when one is)."""
    if policy is None:
        return Text("sidecar policy: -  (no /status from the sidecar yet)")
    state = str(policy.get("state"))
    paused = bool(policy.get("admission_paused"))
    text = Text.assemble(
        "sidecar policy: ",
        (state.upper(), STATE_STYLES.get(state, "bold")),
        "  admission ",
        ("PAUSED (/readyz 503)" if paused else "open", "bold red" if paused else "green"),
        "\nwhy: ",
        str(policy.get("reason")),
    )
    blocked = policy.get("would_restart_but")
    if blocked and str(blocked) not in str(policy.get("reason")):  # the reason often ends with it already
        text.append("\nwould restart, but: ")
        text.append(str(blocked), style="bold yellow")
    return text


def problem_lines(status: Mapping[str, object] | None) -> list[str]:
    """What is wrong, as the policy acts on it: the condition behind its state (why admission is paused, what
    it restarts for) first, then the problems of the sidecar's readings."""
    if status is None:
        return []
    lines: list[str] = []
    policy = status.get("policy")
    if isinstance(policy, Mapping) and str(policy.get("state")) in _ACTING:
        readiness = str(policy.get("readiness") or "")
        paused = bool(policy.get("admission_paused")) and readiness.startswith("paused: ")
        lines.append(readiness if paused else str(policy.get("reason")))
    problems = status.get("problems")
    if isinstance(problems, list):
        lines += [str(problem) for problem in problems if str(problem) not in lines]
    return lines


def problems(status: Mapping[str, object] | None) -> Text:
    lines = problem_lines(status)
    if not lines:
        return Text("problems: none", style="dim")
    policy = status.get("policy") if status is not None else None
    reason = str(policy.get("reason")) if isinstance(policy, Mapping) else None
    # The policy's reason is on the line above (`decision`): said again it would only take the events' rows.
    shown = ["the policy's, in why above" if line == reason else line for line in lines]
    return Text.assemble(("problems: ", "bold red"), "\n          ".join(shown))


def _pct(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{part / whole:.1%}"


def gpu_line(gpu: Mapping[str, object]) -> Text:
    """Used share, the forecast, growth, room against vLLM's budget, in the order a reader needs them."""
    used, total = number(gpu.get("memory_used_bytes")), number(gpu.get("memory_total_bytes"))
    over, tto = number(gpu.get("memory_over_budget_bytes")), number(gpu.get("time_to_oom_seconds"))
    growth, others = number(gpu.get("memory_growth_bytes_per_second")), number(gpu.get("other_process_memory_bytes"))
    share = None if used is None or not total else used / total
    text = Text.assemble(
        f"GPU {gpu.get('gpu')}: ",
        (f"{_pct(used, total)} used", "red" if share is not None and share >= 0.9 else ""),
        ", time to OOM ",
        (duration(tto), "bold red" if tto is not None and tto < 900 else ""),
        ", growth ",
        "-" if growth is None else f"{growth / MIB:+.{0 if abs(growth) >= 10 * MIB else 1}f} MiB/s",
        ", ",
        ("-" if over is None else f"{over / GIB:+.2f} GiB", "red" if over is not None and over > 0 else "green"),
        " over budget",
    )
    if others:
        text.append(f", other processes {others / GIB:.1f} GiB")
    return text


def engine_line(engine: Mapping[str, object]) -> Text:
    kv, stalled = number(engine.get("kv_cache_usage_ratio")), number(engine.get("engine_stalled_seconds"))
    hit = number(engine.get("prefix_cache_hit_ratio"))
    running, waiting = number(engine.get("requests_running")), number(engine.get("requests_waiting"))
    return Text.assemble(
        f"{engine.get('model_name')} #{engine.get('engine')}: KV ",
        ("-" if kv is None else f"{kv:.1%}", "red" if kv is not None and kv >= 0.9 else ""),
        f", {'-' if running is None else f'{running:.0f}'} running, {'-' if waiting is None else f'{waiting:.0f}'} "
        f"waiting, prefix hit {'-' if hit is None else f'{hit:.1%}'}",
        ", stalled ",
        (duration(stalled), "bold red" if stalled else ""),
    )
