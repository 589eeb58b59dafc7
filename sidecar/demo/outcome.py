"""The two vLLMs side by side: the one the sidecar watches and the same one without it. Pure: counts in, lines
out, every number measured in the run."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sidecar.model.text import plural

STUCK_AFTER_S = 10.0  # a request unanswered this long counts as stuck (one takes about 3 s on the simulator)
_ERROR_NAME = re.compile(r"\b(\w+(?:Error|Exception))\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One vLLM's story so far, from the demo's supervisor and load counters."""

    state: str  # the supervisor's phrase: "running, up 30 s", "dead (exit 1), ..."
    crashed_at_s: float | None = None  # the first crash, since the demo's start
    crash_cause: str = ""  # its first error line
    crashes: int = 0
    restarted_at_s: float | None = None  # the sidecar's first restart, since the demo's start
    succeeded: int = 0
    failed: int = 0
    refused: int = 0  # of the failed: sent while nothing listened (down, or starting again)
    interrupted: int = 0
    in_flight: int = 0
    oldest_in_flight_s: float | None = None

    def counted_as(self, later: Side) -> Side:
        """This side as it was (its state, what hung), with the requests counted as `later` counts them: at the
        stop, what was in flight is then counted as interrupted, and the process is stopped."""
        return replace(
            self,
            succeeded=later.succeeded,
            failed=later.failed,
            refused=later.refused,
            interrupted=later.interrupted,
        )


def crash_name(cause: str) -> str:
    """What killed it, in a few words: "CUDA out of memory", else the error's name, else "crash"."""
    if "out of memory" in cause.lower():
        return "CUDA out of memory"
    found = _ERROR_NAME.search(cause)
    return found.group(1) if found is not None else "crash"


def _what(side: Side, restarted: str) -> str:
    parts = []
    if side.crashed_at_s is not None:
        again = f" ({side.crashes} crashes)" if side.crashes > 1 else ""
        parts.append(f"crashed at {side.crashed_at_s:.0f} s: {crash_name(side.crash_cause)}{again}")
    if side.restarted_at_s is not None:
        parts.append(f"{restarted} at {side.restarted_at_s:.0f} s")
    stuck = side.oldest_in_flight_s is not None and side.oldest_in_flight_s >= STUCK_AFTER_S
    if stuck and side.oldest_in_flight_s is not None:
        parts.append(f"hung: {plural(side.in_flight, 'request')} unanswered for {side.oldest_in_flight_s:.0f} s")
    return ", ".join(parts) or side.state


def _counts(side: Side) -> str:
    counts = f"{side.succeeded} ok, {side.failed} failed"
    if side.refused:
        counts += f" ({side.refused} refused while it was down)"
    return counts + (f", {side.interrupted} interrupted by the stop" if side.interrupted else "")


def side_lines(without: Side | None, with_sidecar: Side) -> list[str]:
    """One line a side, the labels aligned: what happened to it, then its requests."""
    if without is None:
        return [f"vLLM: {_what(with_sidecar, 'restarted by the sidecar')}; {_counts(with_sidecar)}"]
    return [
        f"without the sidecar: {_what(without, 'restarted by the sidecar')}; {_counts(without)}",
        f"with the sidecar:    {_what(with_sidecar, 'restarted')}; {_counts(with_sidecar)}",
    ]
