"""What the doctor's relative step for an unstated budget costs, and what a value would cost instead.

Where a log does not state `--gpu-memory-utilization`, the doctor says "lower --gpu-memory-utilization by S below
what you set (... from vLLM's default 0.9 that is V)" as a step, with no value. `python -m
tests.doctor.relative_step_cost` runs the doctor on every corpus log that gets such a step and prints each log's
verdict today and its verdict if V were recommended as a value, then the counts of each change (docs/doctor.md,
"Why a budget the log does not state gets a relative step, measured"). In-process, about 20 s.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from typing import Any

from sidecar.cli import main
from tests.doctor.corpus_verdict import CORPUS, Verdict, entries, verdict

_FROM_DEFAULT = re.compile(r"from vLLM's default [\d.]+ that is (0\.\d+)")
_FLAG = "--gpu-memory-utilization"
_NO_VLLM = ("--vllm-url", "http://127.0.0.1:9", "--timeout", "1")  # nothing to reach, as corpus_verdict runs it


def _doctor(log_file: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(["doctor", "--vllm-log", str(CORPUS / log_file), "--json", "--gpu-source", "none", *_NO_VLLM])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    try:
        document: dict[str, Any] = json.loads(out.getvalue())
    except json.JSONDecodeError:
        document = {}
    return code, document


def _with_value(document: dict[str, Any]) -> dict[str, Any] | None:
    """The document with each relative step's V added to its finding as a recommendation; None without one."""
    changed = False
    findings = []
    for finding in document.get("findings", []):
        values = [float(m.group(1)) for step in finding.get("steps", []) if (m := _FROM_DEFAULT.search(step))]
        recommended = finding["recommendations"]
        if values and not any(r["flag"] == _FLAG for r in recommended):
            recommended = [*recommended, {"flag": _FLAG, "value": values[0]}]
            changed = True
        findings.append({**finding, "recommendations": recommended})
    return {**document, "findings": findings} if changed else None


def main_() -> None:
    changes: Counter[tuple[Verdict, Verdict]] = Counter()
    for entry in entries():
        code, document = _doctor(entry["file"])
        valued = _with_value(document)
        if valued is None:
            continue
        today, instead = verdict(entry, code, document), verdict(entry, code, valued)
        changes[(today, instead)] += 1
        print(f"{today.value:16} -> {instead.value:16} {entry['file']}")
    print()
    for (today, instead), count in sorted(changes.items()):
        print(f"{count:3}  {today.value} -> {instead.value}")
    print(f"{sum(changes.values())} logs get a relative step")


if __name__ == "__main__":
    main_()
