"""What the demo tells: the daemon settings it shortens, and what happens when in each scenario. Pure data.

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
    "burst": "concurrency climbs from 16 to 64 over 20 s with 2,000-token prompts; at ~15 s free GPU memory falls "
    "under 5 %: the sidecar pauses admission and vLLM survives; the pause holds, as PyTorch keeps the memory it "
    "reserved (Ctrl-C ends)",
    "leak": "GPU memory grows with every request; ~35 s: free memory under 5 %, admission paused; ~40 s: the "
    "forecast wants a restart, held back while vLLM is younger than 40 s; ~48 s: the planned restart, drained "
    "(0 running), vLLM back by ~52 s; the demo stops at about 62 s. Left alone, vLLM dies of a CUDA OOM at ~150 s",
    "tenant": "5 s in another process starts on the GPU and grows to 6 GiB; from ~13 s used memory is over vLLM's "
    "budget: pressure, but no pause, since a pause cannot free another process's memory (Ctrl-C ends)",
    "prefix-thrash": "prompts share 128 long prefixes, more than the cache holds: the prefix hit ratio stays low; "
    "nothing to act on (Ctrl-C ends)",
    "hang": "~12 s: the engine stops with requests running, /health stays 200; ~22 s: paused (no progress for 10 s); "
    "~32 s: the engine probe (a 1-token completion) is sent; ~43 s: it got no answer in 10 s, a wedge: restarted "
    "at once (no drain: its requests cannot finish), back by ~45 s; the demo stops at about 55 s",
    "hang-queue": "20 s in the scheduler stops admitting: requests wait with 0 running, counters frozen, /health "
    "200; ~25 s: paused by the queue rule (waiting for capacity > 2 x running for 3 polls); ~45 s: the probe is "
    "sent; ~55 s: no answer, restarted, back by ~58 s; the demo stops at about 68 s",
    "hang-idle": "the load lulls from 20 s to 30 s and the engine stops while idle; /metrics freeze at 0 running and "
    "0 waiting, /health stays 200, and from 30 s every request hangs (watch 'in flight' grow), unseen by the "
    "metrics; ~44 s: the probe is sent (20 s without progress); ~54 s: no answer in 10 s: paused and restarted, "
    "back by ~57 s; the demo stops at about 67 s",
    "startup": "vLLM refuses to start (max seq len larger than the KV cache) and exits at once; the demo starts it "
    "again every ~8 s, as systemd would; the sidecar waits in its startup grace (Ctrl-C ends)",
}


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
