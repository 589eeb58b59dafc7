"""From vLLM's log, as a reader returned it, to why vLLM died: the doctor's log reader and rules. No I/O.

Nothing here parses a log line itself: `parse_log` (the doctor's) reads each start of vLLM, `diagnose` runs
the doctor's rules on it, exactly as `vllm-sidecar doctor --vllm-log FILE` does with no live vLLM.

Which start of vLLM the log is read for (a file or a container's log can hold several; the journal gives
one run per invocation, the Kubernetes API the previous and the current container):
- `Wanted.LAST`, for a planned restart: the newest start; but while it is still starting (no failure, no sign
  of serving, and the platform does not say it ended) after a start that crashed, that one, as the doctor reads
  a file that ends so (`parse_log`): systemd's `Restart=` or the kubelet started vLLM again, likely into the same
  failure. The journal and a pod's log hand each start over as a run of its own, where the doctor cannot see it.
- `Wanted.DIED`, for a death: of the newest two starts, the newer one that shows a crash (a CUDA OOM, a
  refused start, a dead engine); else the newest if the platform says it ended; else the one before it if
  it did not end cleanly (vLLM was brought back since: the newest is loading); else the newest.

The cause is the most severe finding that is a warning or worse: the doctor's `info` advice (prefix caching,
--shutdown-timeout) is good to know, but is not why vLLM died. No such finding leaves the cause unknown,
with a line saying what the log does show.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sidecar.actuators.log_source import LogRead, Wanted
from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.evidence import Evidence, GpuEvidence, LiveEvidence
from sidecar.doctor.finding import Finding, Severity
from sidecar.doctor.formula import gib
from sidecar.doctor.log_parser import log_lines, parse_log, shows_serving
from sidecar.doctor.logfacts import STATED_BY_PROCESS, STATED_BY_VLLM, LogFacts
from sidecar.doctor.render import paste
from sidecar.doctor.setup import Fact, Setup, resolve
from sidecar.doctor.start_args import stated_command, with_stated_command
from sidecar.model.cause import CrashCause, FlagChange
from sidecar.model.remediation import REMEDIABLE
from sidecar.model.server_command import ServerCommand
from sidecar.model.text import plural

MAX_STARTS = 2  # the newest two starts are all any choice above looks at
MAX_EVIDENCE_CHARS = 600  # one evidence line (a refusal quotes vLLM's whole ValueError)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Start:
    facts: LogFacts
    label: str
    ended: str | None
    failed: bool | None
    starting: bool = False  # no failure, no sign of serving, not ended: still starting when the log was read


def explain(read: LogRead, wanted: Wanted, *, wall_time_s: float) -> CrashCause:
    starts = _starts(read)
    if not starts:
        return CrashCause.unknown("vLLM's log is empty", source=read.where, wall_time_s=wall_time_s)
    start = _choose(starts, wanted)
    facts, flags_from = _with_command(start.facts, read.command)
    parts = (read.where, start.label, plural(facts.lines_read, "line"), flags_from)
    source = ", ".join(part for part in parts if part)
    evidence = _evidence(facts, source)
    finding = _cause(evidence)
    ended = (f"how it ended: {start.ended}",) if start.ended else ()
    setup = resolve(evidence)
    ran_with = tuple((flag, float(value)) for flag in REMEDIABLE if (value := _today(flag, setup)) is not None)
    if finding is None:
        said = f" ({start.ended})" if start.ended else ""
        unknown = CrashCause.unknown(_what_it_shows(facts) + said, source=source, wall_time_s=wall_time_s)
        return dataclasses.replace(unknown, crashed=crashed(facts), ran_with=ran_with)
    return CrashCause(
        cause=finding.cause.value,
        severity=finding.severity.value,
        summary=finding.summary,
        evidence=tuple(_cut(line) for line in finding.evidence) + ended,
        recommendations=tuple(
            FlagChange(flag=r.flag, value=r.value, why=r.why, pasted=paste(r), current=_today(r.flag, setup))
            for r in finding.recommendations
        ),
        source=source,
        read_wall_time_s=wall_time_s,
        steps=finding.steps,
        crashed=crashed(facts),
        ran_with=ran_with,
    )


def _with_command(facts: LogFacts, command: ServerCommand | None) -> tuple[LogFacts, str | None]:
    """The start's facts with the flags of the server command line the sidecar saw, where its log does not state
    them (a tail read after hours of serving), and the words that say so; vLLM's own arguments line wins."""
    if command is None or (facts.args is not None and facts.args.stated_by == STATED_BY_VLLM):
        return facts, None
    args, model = stated_command(command.command, stated_by=STATED_BY_PROCESS, strict=False)
    return with_stated_command(facts, args, model), f"flags from {command.where}"


def crashed(facts: LogFacts) -> bool:
    return facts.oom is not None or facts.refusal is not None or facts.engine_dead


def _starts(read: LogRead) -> list[_Start]:
    """The newest MAX_STARTS starts of vLLM in the read, oldest first."""
    starts: list[_Start] = []
    for run in reversed(read.runs):
        lines = log_lines(run.text)  # as the parser counts them: a wrapped line it joins is one line
        newest_in_run = True
        while lines and len(starts) < MAX_STARTS:
            facts = parse_log("\n".join(lines))  # the doctor reads the last start in what it is given
            if not newest_in_run and facts.args is None and not crashed(facts):
                break  # what comes before a start's arguments line is its preamble (banner, warnings)
            if newest_in_run:
                starting = (
                    run.ended is None
                    and not crashed(facts)
                    and not shows_serving(lines[len(lines) - facts.lines_read :])
                )
                starts.append(
                    _Start(facts=facts, label=run.label, ended=run.ended, failed=run.failed, starting=starting)
                )
            else:
                label = ", ".join(part for part in (run.label, "an earlier start") if part)
                starts.append(_Start(facts=facts, label=label, ended=None, failed=None))
            lines = lines[: len(lines) - facts.lines_read]
            newest_in_run = False
        if len(starts) >= MAX_STARTS:
            break
    starts.reverse()
    return starts


def _choose(starts: list[_Start], wanted: Wanted) -> _Start:
    newest = starts[-1]
    if wanted is Wanted.LAST:
        if newest.starting and len(starts) > 1 and crashed(starts[-2].facts):
            before = starts[-2]
            return dataclasses.replace(before, facts=dataclasses.replace(before.facts, later_start_unfinished=True))
        return newest
    crashes = [start for start in starts if crashed(start.facts)]
    if crashes:
        return crashes[-1]
    if newest.ended is not None or len(starts) == 1:
        return newest
    before = starts[-2]
    return before if before.failed is not False else newest


def _evidence(facts: LogFacts, source: str) -> Evidence:
    live = LiveEvidence(
        url="",
        reachable=False,
        error="not asked: only vLLM's log is read",
        version=None,
        max_model_len=None,
        reading=None,
        traffic=None,
    )
    return Evidence(
        live=live, gpu=GpuEvidence(source="none", reading=None, error=None), log=facts, log_path=source, history=None
    )


def _cause(evidence: Evidence) -> Finding | None:
    findings = diagnose(evidence).findings  # most severe first
    return next((finding for finding in findings if finding.severity is not Severity.INFO), None)


def _today(flag: str, setup: Setup) -> int | float | None:
    fact: Fact[int] | Fact[float] | None = {
        "--gpu-memory-utilization": setup.gpu_memory_utilization,
        "--max-model-len": setup.max_model_len,
        "--max-num-seqs": setup.max_num_seqs,
        "--max-num-batched-tokens": setup.max_num_batched_tokens,
    }.get(flag)
    return fact.value if fact is not None else None


def _what_it_shows(facts: LogFacts) -> str:
    if facts.oom is not None:
        tried = f" (tried to allocate {gib(facts.oom.tried_bytes)})" if facts.oom.tried_bytes is not None else ""
        return (
            f"vLLM's log shows a {facts.oom.device} out-of-memory error while "
            f"{facts.oom.phase.value.replace('_', ' ')}{tried}, but no flag change that would prevent it"
        )
    if facts.refusal is not None:
        return f"vLLM refused to start: {_cut(facts.refusal.line)}"
    if facts.engine_dead:
        return "vLLM's engine died (EngineDeadError) and its log does not say why"
    if facts.lines_recognised == 0:
        return f"no line of vLLM recognised in the last {plural(facts.lines_read, 'line')} of its log"
    return "vLLM's log shows no crash (no CUDA out-of-memory error, refused start or dead engine)"


def _cut(line: str) -> str:
    flat = " ".join(line.split())
    return flat if len(flat) <= MAX_EVIDENCE_CHARS else flat[: MAX_EVIDENCE_CHARS - 1] + "…"
