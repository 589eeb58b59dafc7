"""Runs every rule on the evidence and says what was read and what that leaves unchecked. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sidecar.doctor import hygiene
from sidecar.doctor.allocator import history_allocator
from sidecar.doctor.blowout import MIN_REQUESTS, live_blowout
from sidecar.doctor.concurrency import live_concurrency, log_concurrency
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import SEVERITY_ORDER, Cause, Diagnosis, Finding
from sidecar.doctor.fit import live_does_not_fit
from sidecar.doctor.hang import history_hang
from sidecar.doctor.leak import history_leak
from sidecar.doctor.log_memory import log_memory
from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.overshoot import live_overshoot
from sidecar.doctor.paused_concurrency import history_concurrency
from sidecar.doctor.setup import Setup, resolve
from sidecar.doctor.versions import available
from sidecar.model.text import plural

# The arguments the memory readings use, in the order a report names them.
_FLAG_NAMES = (
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "quantization",
    "kv_cache_dtype",
    "enforce_eager",
    "cpu_offload_gb",
)

_CAUSE_ORDER = {cause: index for index, cause in enumerate(Cause)}

Rule = Callable[[Evidence, Setup], Finding | None]


def diagnose(evidence: Evidence) -> Diagnosis:
    setup = resolve(evidence)
    diagnosable = (
        evidence.live.reading is not None
        or (evidence.log is not None and evidence.log.lines_recognised > 0)
        or (evidence.history is not None and evidence.history.policy is not None)  # the daemon's /status
    )
    url = evidence.live.url
    if not diagnosable:
        return Diagnosis(
            version=setup.version_text,
            reachable=evidence.live.reachable,
            url=url,
            findings=(),
            notes=tuple(_notes(evidence, setup)),
            diagnosable=False,
            reason=_reason(evidence),
        )
    rules: tuple[Rule, ...] = (
        live_overshoot,
        log_memory,
        live_blowout,
        live_concurrency,
        log_concurrency,
        history_concurrency,
        history_hang,
        history_leak,
        history_allocator,
        live_does_not_fit,
        hygiene.prefix_caching,
        hygiene.shutdown,
        hygiene.block_size,
    )
    findings = _merged([finding for rule in rules if (finding := rule(evidence, setup)) is not None])
    findings = [_for_version(finding, setup) for finding in findings]
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], _CAUSE_ORDER[f.cause]))
    return Diagnosis(
        version=setup.version_text,
        reachable=evidence.live.reachable,
        url=url,
        findings=tuple(findings),
        notes=tuple(_notes(evidence, setup)),
        diagnosable=True,
    )


def _for_version(finding: Finding, setup: Setup) -> Finding:
    """The last guard of the version table: no flag the detected vLLM does not have (the rules check it where
    they choose between flags; this catches any that does not)."""
    kept = tuple(r for r in finding.recommendations if available(r.flag, setup.version, v0_log=setup.v0_log))
    return finding if len(kept) == len(finding.recommendations) else replace(finding, recommendations=kept)


def _merged(findings: list[Finding]) -> list[Finding]:
    """One finding per concurrency misjudgement: what the daemon's pauses say joins the evidence of the live or
    log finding (whose recommendation, sized from vLLM's own numbers, stands)."""
    concurrency = [f for f in findings if f.cause is Cause.CONCURRENCY_MISJUDGEMENT]
    if len(concurrency) < 2:
        return findings
    first, *rest = concurrency
    dropped = {id(f) for f in rest}
    merged = replace(
        first,
        evidence=first.evidence + tuple(line for f in rest for line in f.evidence if line not in first.evidence),
        recommendations=first.recommendations
        + tuple(r for f in rest for r in f.recommendations if r.flag not in {x.flag for x in first.recommendations}),
    )
    return [merged if f is first else f for f in findings if id(f) not in dropped]


def _reason(evidence: Evidence) -> str:
    live = evidence.live
    why = live.error or "no vllm: metrics"
    if evidence.log_path is None:
        return f"nothing to diagnose: {why}; give --vllm-log FILE to diagnose a vLLM that is not running"
    return f"nothing to diagnose: {why}; and {evidence.log_path} has no vLLM start, refusal or crash line"


def _notes(evidence: Evidence, setup: Setup) -> list[str]:
    notes = [_vllm_note(evidence, setup)]
    gpu = evidence.gpu
    if gpu.reading is not None and gpu.reading.devices:
        notes.append(f"GPU: {len(gpu.reading.devices)} device(s) read from {gpu.source}")
    else:
        why = "--gpu-source none" if gpu.source == "none" else (gpu.error or f"{gpu.source} found no GPU")
        notes.append(
            f"GPU evidence missing ({why}): other tenants and vLLM's memory beyond its budget are not checked "
            "live; the rules that need them use vLLM's metrics and the log only"
        )
    log = evidence.log
    if log is not None:
        notes.append(
            f"log {evidence.log_path}: {plural(log.lines_read, 'line', spec=',')} of the "
            + ("start before the last, which failed" if log.later_start_unfinished else "last start")
            + f", {log.lines_recognised} recognised"
            + (f", vLLM {log.version}" if log.version else "")
            + (
                " (the log ends while a later start is still starting: a supervisor restarting vLLM, likely into "
                "the same failure)"
                if log.later_start_unfinished
                else ""
            )
        )
        notes.append(_flags_note(log))
    else:
        notes.append(
            "no log (--vllm-log): max_num_seqs and max_num_batched_tokens are not published on /metrics, so the "
            "concurrency check relies on preemptions alone"
        )
    if evidence.history is not None:
        notes.append(f"history: {evidence.history.source}")
    traffic = evidence.live.traffic
    if evidence.live.reading is not None and (traffic is None or traffic.requests < MIN_REQUESTS):
        seen = traffic.requests if traffic is not None else 0
        notes.append(
            f"traffic too thin for percentiles: {seen} finished requests (< {MIN_REQUESTS}): max_model_len, "
            "max_num_seqs and prefix caching are not checked against real request sizes"
        )
    if setup.version is None:
        notes.append("vLLM version unknown: only flags every release since 0.5.4 has are recommended")
    notes.extend(evidence.problems)
    return notes


def _flags_note(log: LogFacts) -> str:
    """Where the start's flags came from; without any, how to give them (a step where a value needs the budget)."""
    args = log.args
    if args is None:
        return (
            "flags: not in the log (no 'non-default args' or 'args: Namespace' line, no command line): where a "
            "reading needs them it assumes vLLM's defaults and says so; --vllm-command 'vllm serve MODEL --flag "
            "value ...' gives yours"
        )
    said = ", ".join(f"{name} {getattr(args, name)}" for name in _FLAG_NAMES if getattr(args, name) is not None)
    return f"flags: {args.stated_by}" + (f" ({said})" if said else "")


def _vllm_note(evidence: Evidence, setup: Setup) -> str:
    live = evidence.live
    version = f"vLLM {setup.version_text}" if setup.version_text else "vLLM (version unknown)"
    if live.reading is not None:
        engines = len(live.reading.engines)
        return f"{version} at {live.url}: read /metrics ({live.reading.schema.value} metric names, {engines} engine(s))"
    if live.reachable:
        return f"{version} at {live.url} answered, but {live.error or 'its /metrics could not be used'}"
    return f"{version}: not reachable at {live.url} ({live.error})"
