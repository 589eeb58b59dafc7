"""The diagnosis as the contract's `doctor --json` document, or as text grouped by finding. Pure."""

from __future__ import annotations

import json

from sidecar.doctor.finding import SEVERITY_ORDER, Diagnosis, Finding, Recommendation, Severity

EXIT_HEALTHY = 0
EXIT_FINDINGS = 1
EXIT_UNDIAGNOSABLE = 2


def exit_code(diagnosis: Diagnosis, fail_on: Severity = Severity.INFO) -> int:
    """1 when a finding is at least as severe as `fail_on` (by default any finding, as the contract says)."""
    if not diagnosis.diagnosable:
        return EXIT_UNDIAGNOSABLE
    failing = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] <= SEVERITY_ORDER[fail_on]]
    return EXIT_FINDINGS if failing else EXIT_HEALTHY


def document(diagnosis: Diagnosis) -> dict[str, object]:
    return {
        "vllm": {"version": diagnosis.version, "reachable": diagnosis.reachable, "url": diagnosis.url},
        "findings": [_finding(finding) for finding in diagnosis.findings],
        "notes": list(diagnosis.notes),
        "diagnosable": diagnosis.diagnosable,
        "reason": diagnosis.reason,
    }


def render_json(diagnosis: Diagnosis) -> str:
    return json.dumps(document(diagnosis), indent=2, allow_nan=False)


def _finding(finding: Finding) -> dict[str, object]:
    return {
        "cause": finding.cause.value,
        "severity": finding.severity.value,
        "summary": finding.summary,
        "evidence": list(finding.evidence),
        "recommendations": [{"flag": r.flag, "value": r.value, "why": r.why} for r in finding.recommendations],
        "steps": list(finding.steps),
    }


def paste(recommendation: Recommendation) -> str:
    """The recommendation as it goes on a command line, in an environment or in a pod spec."""
    flag, value = recommendation.flag, recommendation.value
    if flag.isupper():
        return f"{flag}={value}"
    if not flag.startswith("--"):
        return f"{flag}: {value}"
    return flag if value == "" else f"{flag} {value}"


def render_text(diagnosis: Diagnosis) -> str:
    version = diagnosis.version or "version unknown"
    state = "reachable" if diagnosis.reachable else "not reachable"
    lines = [f"vllm-sidecar doctor: vLLM {version} at {diagnosis.url} ({state})"]
    if not diagnosis.diagnosable:
        lines.append(f"could not diagnose: {diagnosis.reason}")
    elif not diagnosis.findings:
        lines.append("no findings: nothing points at an OOM root cause in what was read")
    else:
        lines.append(f"{len(diagnosis.findings)} finding(s)")
    for finding in diagnosis.findings:
        lines.append("")
        lines.append(f"[{finding.severity.value.upper()}] {finding.cause.value}: {finding.summary}")
        lines.append("  evidence:")
        lines.extend(f"    - {line}" for line in finding.evidence)
        if finding.recommendations:
            lines.append("  recommendations:")
            for recommendation in finding.recommendations:
                lines.append(f"    {paste(recommendation)}")
                lines.append(f"        {recommendation.why}")
        if finding.steps:
            lines.append("  do and collect:")
            lines.extend(f"    - {step}" for step in finding.steps)
    lines.append("")
    lines.append("read:")
    lines.extend(f"  - {note}" for note in diagnosis.notes)
    return "\n".join(lines)
