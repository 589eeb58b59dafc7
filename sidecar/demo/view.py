"""The demo's detailed widgets: the daemon's /status document as tables and a panel, for a terminal with room
(`screen` picks them, or `compact`'s one-liners). Pure: data in, rich out.

They show what the sidecar sees (KV usage, hit ratio, blocks per request, GPU headroom, forecast time to
OOM), what its policy decides and why (its state, the reason, and the restart a guard holds back: "would
restart, but ..."), and what happened (source failures, problems, vLLM dying and coming back), and nothing
the daemon did not report: a value it does not know reads "-", never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.panel import Panel
from rich.table import Table
from rich.text import Text

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    scenario: str
    sim_url: str
    sidecar_url: str
    elapsed_s: float
    story: str = ""  # what this scenario does, when
    settings: str = ""  # what the demo changed from the daemon's defaults, and how restarts happen
    ending: str = ""  # when and why the demo will stop by itself


def number(value: object) -> float | None:
    """A JSON number from /status, or None for null, a bool or anything else: shown as "-"."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _num(value: object, pattern: str = "{:.1f}") -> str:
    known = number(value)
    return "-" if known is None else pattern.format(known)


def _ratio_bar(value: object, width: int = 20) -> Text:
    ratio = number(value)
    if ratio is None:
        return Text("-")
    filled = round(max(0.0, min(1.0, ratio)) * width)
    style = "red" if ratio >= 0.9 else "yellow" if ratio >= 0.8 else "green"
    return Text("█" * filled + "░" * (width - filled) + f" {ratio:6.1%}", style=style)


def duration(value: object) -> str:
    seconds = number(value)
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 600:  # below, seconds: a forecast counting down moves every poll
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def engines_table(engines: Sequence[Mapping[str, object]]) -> Table:
    table = Table(title="vLLM engines (what the sidecar derives)", expand=True)
    for column in (
        "engine",
        "KV cache usage",
        "running",
        "waiting",
        "blocks/req",
        "headroom",
        "frag.",
        "prefix hit",
        "stalled",
    ):
        table.add_column(column, justify="left" if column in ("engine", "KV cache usage") else "right")
    for engine in engines:
        table.add_row(
            f"{engine.get('model_name')} #{engine.get('engine')}",
            _ratio_bar(engine.get("kv_cache_usage_ratio")),
            _num(engine.get("requests_running"), "{:.0f}"),
            _num(engine.get("requests_waiting"), "{:.0f}"),
            _num(engine.get("kv_cache_blocks_per_request")),
            _num(engine.get("kv_cache_request_headroom")),
            _num(engine.get("kv_cache_fragmentation_ratio"), "{:.1%}"),
            _num(engine.get("prefix_cache_hit_ratio"), "{:.1%}"),
            duration(engine.get("engine_stalled_seconds")),
        )
    if not engines:
        table.add_row("(no engine data: vLLM not readable)", *[""] * 8)
    return table


def _gib(value: object, pattern: str = "{:.1f} GiB") -> str:
    size = number(value)
    return "-" if size is None else pattern.format(size / GIB)


def gpus_table(gpus: Sequence[Mapping[str, object]]) -> Table:
    table = Table(title="GPUs", expand=True)
    for column in (
        "gpu",
        "used",
        "used / total",
        "vLLM budget",
        "over budget",
        "other tenants",
        "growth",
        "time to OOM",
    ):
        table.add_column(column, justify="left" if column in ("gpu", "used") else "right")
    for gpu in gpus:
        used, total = number(gpu.get("memory_used_bytes")), number(gpu.get("memory_total_bytes"))
        over = number(gpu.get("memory_over_budget_bytes"))
        growth = number(gpu.get("memory_growth_bytes_per_second"))
        tto = number(gpu.get("time_to_oom_seconds"))
        table.add_row(
            str(gpu.get("gpu")),
            _ratio_bar(used / total if used is not None and total else None),
            f"{_gib(used, '{:.1f}')} / {_gib(total, '{:.0f}')} GiB",
            _gib(gpu.get("memory_budget_bytes")),
            Text("-") if over is None else Text(_gib(over, "{:+.2f} GiB"), style="red" if over > 0 else "green"),
            _gib(gpu.get("other_process_memory_bytes")),
            "-" if growth is None else f"{growth / MIB:+.1f} MiB/s",
            Text(duration(tto), style="bold red" if tto is not None and tto < 900 else ""),
        )
    if not gpus:
        table.add_row("(no GPU data)", *[""] * 7)
    return table


STATE_STYLES = {
    "normal": "bold green",
    "starting": "bold",
    "pressure": "bold yellow",
    "paused": "bold red",
    "draining": "bold magenta",
    "restarting": "bold magenta",
    "cooldown": "bold cyan",
    "failed": "bold red",
}


def policy_panel(policy: Mapping[str, object] | None) -> Panel:
    """The policy's state, its reason and the restart a guard holds back, always in the same three lines."""
    if policy is None:
        body = Text("state: -  (no /status from the sidecar yet)\nwhy: -\nwould restart, but: -")
        return Panel(body, title="the sidecar's policy", expand=True)
    state = str(policy.get("state"))
    paused = bool(policy.get("admission_paused"))
    blocked = policy.get("would_restart_but")
    body = Text.assemble(
        "state: ",
        (state.upper(), STATE_STYLES.get(state, "bold")),
        "   admission: ",
        ("PAUSED" if paused else "admitting", "bold red" if paused else "green"),
        f" (/readyz: {policy.get('readiness')})",
        "\nwhy: ",
        str(policy.get("reason")),
        "\nwould restart, but: ",
        (str(blocked), "bold yellow") if blocked else ("- (no restart held back)", "dim"),
    )
    return Panel(body, title="the sidecar's policy (live, from its /status)", expand=True)
