"""A log that ends inside a traceback, before its error line (an excerpt cut short): what the phase its frames
name makes likely, what to look for, and only the remedies that are right whatever the error was. Pure.
"""

from __future__ import annotations

from sidecar.doctor.capture_sizes import fewer_or_no_graphs
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import LogFacts, OomPhase
from sidecar.doctor.remedies import sequences
from sidecar.doctor.setup import Setup


def cut_traceback(phase: OomPhase, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    if phase is OomPhase.PROFILING:
        return _cut_in_profile_run(ledger, setup, log)
    if phase is OomPhase.GRAPH_CAPTURE:
        return _cut_in_graph_capture(ledger, setup, log)
    return None


def _cut_in_profile_run(ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    """The log ends inside a traceback through the profile run, its error line cut: most often the dummy batch
    ran out of memory, but the log does not say so. What to look for, and the first step if it did."""
    halved = sequences(setup, log, "the profile run runs max_num_seqs dummy requests")
    first = (
        f"set --max-num-seqs {halved.value} ({halved.why})"
        if halved is not None
        else "halve --max-num-seqs (the profile run runs that many dummy requests)"
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.WARNING,
        summary="vLLM failed in its profile run, before the KV cache; the error itself is cut from the log",
        evidence=(
            "the log ends inside a traceback through the profile run (the dummy batch that sizes the KV cache), "
            "before the error line",
            *ledger.lines(),
        ),
        steps=(
            "find the error line at the traceback's end: if it is CUDA out of memory, the dummy batch did not fit "
            f"beside the weights, and gpu_memory_utilization does not cap it: {first}; with a multimodal model, "
            "fewer or smaller images per prompt (--limit-mm-per-prompt) shrink it too",
        ),
    )


def _cut_in_graph_capture(ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding:
    """The log ends inside a traceback through the CUDA graph capture, its error line cut. Graphs are captured
    after the KV cache took the budget, in memory the budget leaves: an OOM there is the likeliest error. Eager
    mode skips the capture whatever the error was; a lower budget helps only if it was an OOM, so it is a step."""
    lines: list[str] = []
    eager = fewer_or_no_graphs(
        setup,
        log,
        lines,
        eager_why="skips the capture, whatever its error was (an OOM or a capture that fails), at the cost of "
        "slower decoding",
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.WARNING,
        summary="vLLM failed capturing CUDA graphs, after the KV cache took its budget; the error itself is cut "
        "from the log",
        evidence=(
            "the log ends inside a traceback through the CUDA graph capture (after the KV cache was allocated), "
            "before the error line",
            *lines,
            *ledger.lines(),
        ),
        recommendations=tuple(eager),
        steps=(
            "find the error line at the traceback's end: if it is CUDA out of memory, the graphs did not fit in "
            "what the budget leaves of the card: keep the graphs with a --gpu-memory-utilization a few "
            "hundredths below what you set (the graphs' size is in the line 'Graph capturing finished in N secs, "
            "took X GiB' of a start that got through)",
        ),
    )
