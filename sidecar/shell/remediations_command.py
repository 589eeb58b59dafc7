"""`vllm-sidecar remediations`: what the sidecar changed in vLLM's flags (--remediate), and taking it back.

    vllm-sidecar remediations list [--json]          every step, oldest first, and what vLLM's next start gets
    vllm-sidecar remediations revert [FLAG ...]      take back the newest standing change of each FLAG (all: none given)
    vllm-sidecar remediations release FLAG ...       let the sidecar change a held flag again

Works beside a running daemon: both write under the record's lock, and the daemon reads the record afresh
before it decides. A revert holds the flag (the sidecar changes it no more until `release`) and takes effect at
vLLM's next start: restart vLLM to apply it now. Exit 0, 1 when there was nothing to revert or release, 2 for a
record that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sidecar.actuators.remediation_record import RecordError, flags_text
from sidecar.model.remediation import REMEDIABLE, Step
from sidecar.policy.remediation import flags_in_effect, release, revert_by_person
from sidecar.shell.remediation_store import RemediationStore

DEFAULT_STATE_DIR = Path("/var/lib/vllm-sidecar")  # the daemon's --state-dir default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "revert", "release"), help="list, revert or release")
    parser.add_argument("flags", nargs="*", metavar="FLAG", help="e.g. max-model-len (revert: default every flag)")
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, metavar="PATH", help="the daemon's --state-dir"
    )
    parser.add_argument("--json", action="store_true", help="list: the record as JSON")


def run(args: argparse.Namespace) -> int:
    store = RemediationStore(args.state_dir)
    try:
        flags = [_flag(name) for name in args.flags]
    except ValueError as error:
        return _error(str(error))
    try:
        if args.action == "list":
            return _list(store, as_json=bool(args.json))
        return _change(store, args.action, flags)
    except RecordError as error:
        return _error(str(error))


def _flag(name: str) -> str:
    flag = "--" + name.removeprefix("--")
    if flag not in REMEDIABLE:
        raise ValueError(f"{name}: not a flag the sidecar changes (one of: {', '.join(REMEDIABLE)})")
    return flag


def _list(store: RemediationStore, *, as_json: bool) -> int:
    steps = store.steps()
    if as_json:
        document = {
            "flags_file": str(store.flags_path),
            "flags": flags_in_effect(steps),
            "steps": [_row(step) for step in steps],
        }
        print(json.dumps(document, indent=2))
        return 0
    if not steps:
        print(f"no change to vLLM's flags recorded in {store.record_path}")
        return 0
    for step in steps:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(step.wall_time_s))
        held = ", held" if step.held else ""
        print(f"{when}  {step.diff()}  ({step.cause})  {step.state}{held}")
        print(f"    why: {step.why}")
        if step.outcome:
            print(f"    {step.outcome}")
    print(f"vLLM's next start gets ({store.flags_path}): {flags_text(steps).splitlines()[-1]}")
    return 0


def _change(store: RemediationStore, action: str, flags: list[str]) -> int:
    if action == "release" and not flags:
        return _error("release needs the FLAG to release, e.g. max-model-len")
    done: list[str] = []

    def edit(steps: list[Step]) -> list[Step]:
        wanted = flags or sorted(flags_in_effect(steps))
        for flag in wanted:
            changed = revert_by_person(steps, flag, time.time()) if action == "revert" else release(steps, flag)
            if changed is not None:
                steps = changed
                done.append(flag)
        return steps

    steps = store.change(edit)
    if not done:
        print(f"nothing to {action}: the sidecar {'sets' if action == 'revert' else 'holds'} none of these flags")
        return 1
    if action == "revert":
        print(f"reverted and held: {', '.join(done)}; restart vLLM to apply it now (else at its next start)")
    else:
        print(f"released: {', '.join(done)}; the sidecar may change them again")
    print(f"vLLM's next start gets ({store.flags_path}): {flags_text(steps).splitlines()[-1]}")
    return 0


def _row(step: Step) -> dict[str, object]:
    return {
        "flag": step.flag,
        "change": step.diff(),
        "cause": step.cause,
        "why": step.why,
        "state": str(step.state),
        "outcome": step.outcome,
        "held": step.held,
        "timestamp_seconds": step.wall_time_s,
        "resolved_timestamp_seconds": step.resolved_wall_time_s,
    }


def _error(why: str) -> int:
    print(f"vllm-sidecar: error: {why}", file=sys.stderr)
    return 2
