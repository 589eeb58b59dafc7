"""The verdict on one corpus log: what the doctor answered against what `index.toml` says is right.

`python -m tests.doctor.corpus_verdict` runs the doctor (this checkout's, or another's with `--source DIR`) on
the corpus as a user would (`doctor --vllm-log FILE --json`, no vLLM, no GPU) and prints each verdict and the
counts. `--record` writes `first_contact` into `index.toml` for the entries that have none yet: run it once,
right after committing new entries and before changing the doctor for them (docs/doctor.md, "First contact").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).parent / "corpus"
INDEX = CORPUS / "index.toml"


class Verdict(StrEnum):
    RIGHT = "right"  # an accepted cause, an expected recommendation in range, nothing wrong
    WRONG_DIRECTION = "wrong_direction"  # some recommendation would make the next start more likely to fail
    WRONG_CAUSE = "wrong_cause"
    OUT_OF_RANGE = "out_of_range"  # the cause is right, no expected recommendation is (in range)
    NO_FINDING = "no_finding"  # exit 0 or 2: nothing said, or the log not read at all


def entries() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = tomllib.loads(INDEX.read_text(encoding="utf-8"))["log"]
    return loaded


def matches(spec: dict[str, Any], flag: str, value: object) -> bool:
    """Does a recommendation (flag, value) fall under an `expect` or `wrong` item?"""
    if spec["flag"] != flag:
        return False
    if "value" in spec:
        return bool(value == spec["value"])
    if "values" in spec:
        return value in spec["values"]
    if "min" not in spec and "max" not in spec:
        return True
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return bool(spec.get("min", float("-inf")) <= value <= spec.get("max", float("inf")))


def verdict(entry: dict[str, Any], code: int, document: dict[str, Any]) -> Verdict:
    findings: list[dict[str, Any]] = document.get("findings", [])
    every = [(r["flag"], r["value"]) for finding in findings for r in finding["recommendations"]]
    if any(matches(spec, flag, value) for spec in entry.get("wrong", []) for flag, value in every):
        return Verdict.WRONG_DIRECTION
    if code != 1 or not findings:
        return Verdict.NO_FINDING
    first = findings[0]
    if first["cause"] not in entry["causes"]:
        return Verdict.WRONG_CAUSE
    expected = entry.get("expect", [])
    recommended = [(r["flag"], r["value"]) for r in first["recommendations"]]
    if expected and not any(matches(spec, flag, value) for spec in expected for flag, value in recommended):
        return Verdict.OUT_OF_RANGE
    return Verdict.RIGHT


def run_doctor(log: Path, *, source: Path | None = None) -> tuple[int, dict[str, Any]]:
    """`doctor --vllm-log LOG --json` in a subprocess, with no vLLM to reach and no GPU to read."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    command = [sys.executable, "-m", "sidecar", "doctor", "--vllm-log", str(log), "--json", "--gpu-source", "none"]
    command += ["--vllm-url", "http://127.0.0.1:9", "--timeout", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=120)
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        document = {}
    return done.returncode, document


def _record(results: dict[str, Verdict], doctor: str) -> None:
    """Append `first_contact` to each named entry that has none (text edit: the file's comments stay)."""
    text = INDEX.read_text(encoding="utf-8")
    for name, found in results.items():
        block = re.search(rf'\[\[log\]\]\nfile = "{re.escape(name)}"\n(?:(?!\[\[log\]\]).*\n?)*', text)
        if block is None or "first_contact" in block.group(0):
            continue
        line = f'first_contact = {{ verdict = "{found}", doctor = "{doctor}" }}\n'
        end = block.end()
        text = text[:end].rstrip("\n") + "\n" + line + ("\n" if end < len(text) else "") + text[end:].lstrip("\n")
    INDEX.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--set", dest="sets", action="append", help="only entries of this set (repeatable)")
    parser.add_argument("--source", type=Path, help="the checkout whose doctor runs (default: this one)")
    parser.add_argument("--record", metavar="COMMIT", help="write first_contact for entries without one")
    args = parser.parse_args(argv)
    chosen = [entry for entry in entries() if not args.sets or entry["set"] in args.sets]
    results: dict[str, Verdict] = {}
    for entry in chosen:
        code, document = run_doctor(CORPUS / entry["file"], source=args.source)
        found = verdict(entry, code, document)
        results[entry["file"]] = found
        first = document.get("findings", [{}])[0] if document.get("findings") else {}
        said = ", ".join(f"{r['flag']} {r['value']}" for r in first.get("recommendations", []))
        print(f"{found:<16} {entry['file']:<58} {first.get('cause', '-')}: {said or '-'}")
    counts = Counter(results.values())
    print(", ".join(f"{verdict}: {counts[verdict]}" for verdict in Verdict), f"of {len(results)}")
    if args.record:
        _record(results, args.record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
