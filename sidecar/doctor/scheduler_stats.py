"""The scheduler's own lines in a log: its stats line, V0's preemption warnings, LMCache's notices. Pure.

Each pattern is matched by `log_parser` and its function stores what it says in the parser's facts: the busiest
stats line and the full ones (how many requests a full cache held, `concurrency`'s squeeze), and the preemptions
counted from whichever source the log has (V1's stats field, V0's warnings and counter, the connector's ids).
"""

from __future__ import annotations

import re

from sidecar.doctor.log_records import loose
from sidecar.doctor.logfacts import FULL_CACHE, Facts, SchedulerStats

PREEMPTIONS = re.compile(r"total_num_cumulative_preemption=(\d+)")

PREEMPTED = loose(  # a paste may cut the warning after its start: still a warning, its mode unknown
    r"is preempted by PreemptionMode\.(\w+) mode because there is not enough KV cache space"
    r"|Sequence group \S+ is preempted by(?: PreemptionMode\.(\w+)\b)?[^\n]{0,60}$"
)

# V0's scheduler warns at the 1st, 51st, 101st... preemption only (`num_cumulative_preemption % 50 == 0`): each
# warning after a log's first stands for 50 more, whether or not its counter survived the paste.
V0_PREEMPTIONS_PER_WARNING = 50

# LMCache's vLLM connector (lmcache_mp_connector.py) logs the scheduler's own preemptions, one of two notices a
# step: "<preempted> by preempted requests: {'id', ...}" (preempted this step) or "<preempted> by resumed requests:
# {...}" (taken back this step). vLLM itself prints nothing of them on V1 before 0.11.2's stats field.
CONNECTOR_PREEMPTED = loose(r"<preempted> by (?:preempted|resumed) requests: \{([^}]*)")

# V0: `Running: R reqs, Swapped: S reqs, Pending: W reqs, GPU KV cache usage: U%`; V1: `Running: R reqs, Waiting: W
# reqs, [Deferred: D reqs, ][KV fetch: ..., ][Preemptions: P, ]GPU|CPU KV cache usage: U%` (Preemptions since 0.11.2:
# the preemptions of that interval, printed only when some happened; the device name from 0.30).
STATS = loose(
    r"Running: (\d+) reqs, (?:Swapped: (\d+) reqs, )?(?:Pending|Waiting): (\d+) reqs, (?:[^%]*?Preemptions: (\d+), )?"
    r"(?:[^%]*?)\b[A-Z]+(?: \+ host)? KV cache usage: ([\d.]+)%"
)


def stats_line(match: re.Match[str], facts: Facts) -> None:
    stats = SchedulerStats(
        running=int(match.group(1)),
        swapped=int(match.group(2)) if match.group(2) is not None else None,
        waiting=int(match.group(3)),
        kv_usage=float(match.group(5)) / 100,
    )
    if match.group(4) is not None:  # V1 0.11.2+: this interval's preemptions; the log's total is their sum
        facts["v1_preemptions"] = int(str(facts.get("v1_preemptions", 0))) + int(match.group(4))
        facts["preemptions"] = int(str(facts.get("preemptions", 0))) + int(match.group(4))
        facts.setdefault("preemption_mode", "V1 RECOMPUTE")
    previous = facts.get("busiest")
    if not isinstance(previous, SchedulerStats) or stats.kv_usage >= previous.kv_usage:
        facts["busiest"] = stats
    after_full = facts.get(LAST_FULL) is True
    facts[LAST_FULL] = stats.kv_usage >= FULL_CACHE
    if stats.kv_usage >= FULL_CACHE:
        most = facts.get("full_most_running")
        facts["full_most_running"] = max(stats.running, most if isinstance(most, int) else 0)
    # The line after a full one counts too: the requests it preempted freed their blocks before it was printed.
    # Of these, the one whose requests each took the most of the cache bounds how many it holds.
    if (stats.kv_usage >= FULL_CACHE or after_full) and stats.waiting > 0 and stats.kv_usage > 0:
        least = facts.get("full_least")
        if not isinstance(least, SchedulerStats) or stats.running / stats.kv_usage <= least.running / least.kv_usage:
            facts["full_least"] = stats


def preemption_warning(match: re.Match[str], facts: Facts) -> None:
    mode = match.group(1) or match.group(2)
    if mode is not None:
        facts["preemption_mode"] = mode
    warnings = int(str(facts.get("preemption_warnings", 0))) + 1
    facts["preemption_warnings"] = warnings
    # a warning without a counter still means at least one, and each after the first 50 more
    at_least = 1 + V0_PREEMPTIONS_PER_WARNING * (warnings - 1)
    facts["preemptions"] = max(at_least, int(str(facts.get("preemptions", 0))))


def connector_notice(match: re.Match[str], facts: Facts) -> None:
    # Each id once: a request preempted, then resumed, is named by both notices (so the count is a floor).
    seen = facts.get(CONNECTOR_IDS)
    if not isinstance(seen, set):
        seen = facts[CONNECTOR_IDS] = set()
    seen.update(name for part in match.group(1).split(",") if (name := part.strip(" '\"")))


CONNECTOR_IDS = "connector_preempted_ids"  # a working set of `_facts`, not a LogFacts field

LAST_FULL = "last_stats_full"  # whether the latest stats line had the KV cache full; likewise


def preemption_total(match: re.Match[str], facts: Facts) -> None:
    facts["preemptions"] = max(int(match.group(1)), int(str(facts.get("preemptions", 0))))
