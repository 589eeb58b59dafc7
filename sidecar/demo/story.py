"""What the demo tells: the daemon settings it shortens, what happens when in each scenario, and when its story is
over. Pure.

The timings are measured (docs/tools.md says where): they are what a user sees on a small machine, give or take
a few seconds, counted from the demo's start.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from sidecar.shell.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Shortened:
    setting: str  # the Settings field, whose default the screen quotes
    value: str

    @property
    def flag(self) -> str:
        return "--" + self.setting.replace("_", "-")

    @property
    def default(self) -> str:
        value = Settings.model_fields[self.setting].default
        return f"{value:g}" if isinstance(value, int | float) else str(value)


# The daemon's defaults suit a server that runs for days; a demo has a minute or two.
SHORTENED: tuple[Shortened, ...] = (
    Shortened(setting="forecast_min_uptime", value="40"),
    Shortened(setting="drain_timeout", value="20"),
    Shortened(setting="hung_after", value="30"),
    Shortened(setting="probe_timeout", value="10"),
    Shortened(setting="startup_timeout", value="60"),
)

ADAPTER_NOTE = (
    "the sidecar restarts vLLM with --actuator exec running `python -m sidecar.demo.restart`: the demo stops the "
    "simulator (SIGTERM) and starts it again, as systemctl restart would; a simulator that dies on its own is "
    "started again after --restart-delay, as Restart=on-failure would"
)

STORIES: dict[str, str] = {
    "healthy": "nothing goes wrong; KV usage, prefix hits and memory settle and the policy stays normal (Ctrl-C ends)",
    "burst": "concurrency climbs from 16 to 64 over 20 s with 2,000-token prompts; at ~10 s free GPU memory falls "
    "under 5 %: the sidecar pauses admission and its vLLM survives (the pause holds, as PyTorch keeps the memory "
    "it reserved); the same vLLM without the sidecar dies of a CUDA OOM at ~25 s; the demo stops 5 s later",
    "leak": "GPU memory grows with every request; ~35 s: free memory under 5 %, admission paused, and the forecast "
    "time to OOM counts down; ~40 s: it wants a restart, held back while vLLM is younger than 40 s; ~45 s: the "
    "planned restart, drained (0 running), vLLM back by ~50 s; the same vLLM without the sidecar, under the same "
    "load, dies of a CUDA OOM at ~60 s; the demo stops 5 s later",
    "tenant": "5 s in another process starts on the GPU and grows to 6 GiB; from ~13 s used memory is over vLLM's "
    "budget: pressure, but no pause, since a pause cannot free another process's memory (Ctrl-C ends)",
    "prefix-thrash": "prompts share 128 long prefixes, more than the cache holds: the prefix hit ratio stays low; "
    "nothing to act on (Ctrl-C ends)",
    "hang": "~12 s: the engine stops with requests running, /health stays 200; ~23 s: paused (no progress for 10 s) "
    "and the engine probe (a 1-token completion) sent; ~33 s: no answer in 10 s; ~43 s: no progress for 30 s and "
    "the probe unanswered, a wedge: restarted at once (no drain: its requests cannot finish), back by ~45 s; the "
    "demo stops at about 55 s, the vLLM without the sidecar still hung",
    "hang-queue": "20 s in the scheduler stops admitting: requests wait with 0 running, counters frozen, /health "
    "200; ~27 s: paused by the queue rule (waiting for capacity > 2 x running for 3 polls); ~36 s: the probe is "
    "sent; ~46 s: no answer; ~55 s: restarted, back by ~60 s; the demo stops at about 70 s, the vLLM without the "
    "sidecar still wedged",
    "hang-idle": "the load lulls from 20 s to 30 s and the engine stops while idle; /metrics freeze at 0 running and "
    "0 waiting, /health stays 200, and from 30 s every request hangs, unseen by the metrics; ~47 s: the probe is "
    "sent (20 s without progress); ~57 s: no answer in 10 s: paused and restarted, back by ~60 s; the demo stops "
    "at about 70 s, the vLLM without the sidecar still wedged",
    "startup": "vLLM refuses to start (max seq len larger than the KV cache) and exits at once; the demo starts it "
    "again every ~8 s, as systemd would; the sidecar waits in its startup grace (Ctrl-C ends)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """A scenario shown beside the same vLLM without a sidecar, and what the demo waits for before it stops."""

    sidecar_restarts: bool  # the story ends once vLLM is back from the sidecar's restart
    twin_crashes: bool  # ... and once the vLLM without it has crashed (a hang only hangs: nothing to wait for)


# The scenarios whose failure the sidecar prevents or ends; the others (nothing wrong, nothing to act on, or
# nothing a sidecar can do) run alone.
COMPARED: dict[str, Comparison] = {
    "burst": Comparison(sidecar_restarts=False, twin_crashes=True),
    "leak": Comparison(sidecar_restarts=True, twin_crashes=True),
    "hang": Comparison(sidecar_restarts=True, twin_crashes=False),
    "hang-queue": Comparison(sidecar_restarts=True, twin_crashes=False),
    "hang-idle": Comparison(sidecar_restarts=True, twin_crashes=False),
}


LINGER_S = 10.0  # after vLLM is back from the sidecar's restart: long enough to see it serve again
TWIN_LINGER_S = 5.0  # after the vLLM without the sidecar crashed: long enough to read it
TWIN_WAIT_S = 60.0  # after the sidecar's restart, the longest the demo waits for that crash


def end_at(
    comparison: Comparison | None, *, back_s: float | None, twin_crash_s: float | None, now_s: float
) -> float | None:
    """When the story is over and the demo stops by itself (None: not known yet), from when vLLM was back from
    the sidecar's restart and when the vLLM without the sidecar crashed (None: not yet)."""
    after_restart = None if back_s is None else back_s + LINGER_S
    if comparison is not None and comparison.sidecar_restarts and after_restart is None:
        return None
    if comparison is None or not comparison.twin_crashes:
        return after_restart
    if twin_crash_s is None:  # it may outlast a slow machine's demo: a minute after the restart at most
        waited = back_s is not None and now_s - back_s >= TWIN_WAIT_S
        return now_s if waited else None
    return max(twin_crash_s + TWIN_LINGER_S, after_restart or 0.0)


KEEP_RUNNING = (
    "with --keep-running, leak goes on: the sidecar restarts vLLM again at ~110 s (after its 60 s cooldown) and "
    "~240 s (after the doubled cooldown, 0.8 GiB from the OOM); its budget of 3 restarts an hour then holds the "
    "fourth back and vLLM dies of the OOM at ~395 s"
)


def daemon_flags() -> list[str]:
    """The shortened settings as the daemon's command line."""
    return [word for item in SHORTENED for word in (item.flag, item.value)]


def shortened_line() -> str:
    shown = ", ".join(f"{item.flag} {item.value} (default {item.default})" for item in SHORTENED)
    return f"shortened for the demo: {shown}"


def help_epilog(width: int = 100) -> str:
    """The scenarios' timelines and the demo's settings, wrapped for `--help`."""
    name_width = max(len(name) for name in STORIES)
    lines = ["scenarios: what happens when, counted from the demo's start (measured on a busy 2-core VM):"]
    for name, text in STORIES.items():
        lines += textwrap.wrap(
            text,
            width,
            initial_indent=f"  {name:<{name_width}}  ",
            subsequent_indent=" " * (name_width + 4),
            break_on_hyphens=False,
        )
    lines.append("")
    lines += textwrap.wrap(KEEP_RUNNING + ".", width, break_on_hyphens=False)
    lines.append("")
    lines += textwrap.wrap(shortened_line() + ".", width, break_on_hyphens=False)
    lines += textwrap.wrap(ADAPTER_NOTE + ".", width, break_on_hyphens=False)
    return "\n".join(lines)
