"""`vllm-sidecar remediations`: what the sidecar changed in vLLM's flags (--remediate), and taking it back.

    vllm-sidecar remediations list [--json]          every step, oldest first, and what vLLM's next start gets
    vllm-sidecar remediations revert [FLAG ...]      take back the newest standing change of each FLAG (all: none given)
    vllm-sidecar remediations release FLAG ...       let the sidecar change a held flag again

The record is the state dir's (systemd, exec: `--state-dir`) or, on Kubernetes, vLLM's Deployment's
(`--deployment NAME`, with `--namespace`, `--container` and the kubeconfig kubectl would use). Works beside a
running daemon: on a host both write under the record's lock, on Kubernetes a write conditional on the
Deployment's resourceVersion loses nothing; the daemon reads the record afresh before it decides. A revert holds
the flag (the sidecar changes it no more until `release`); on a host it takes effect at vLLM's next start
(restart vLLM to apply it now), on Kubernetes the Deployment rolls out with it. Exit 0, 1 when there was nothing
to revert or release, 2 for a record that cannot be used or reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sidecar.actuators.remediation_record import RecordError, flag_words
from sidecar.model.remediation import REMEDIABLE, Step
from sidecar.policy.remediation import flags_in_effect, release, revert_by_person
from sidecar.shell.remediation_store import FlagsTarget, RemediationStore

DEFAULT_STATE_DIR = Path("/var/lib/vllm-sidecar")  # the daemon's --state-dir default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "revert", "release"), help="list, revert or release")
    parser.add_argument("flags", nargs="*", metavar="FLAG", help="e.g. max-model-len (revert: default every flag)")
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, metavar="PATH", help="the daemon's --state-dir"
    )
    parser.add_argument("--deployment", metavar="NAME", help="Kubernetes: vLLM's Deployment, whose record it is")
    parser.add_argument("--namespace", metavar="NAME", help="its namespace (default: the kubeconfig context's)")
    parser.add_argument("--container", default="vllm", metavar="NAME", help="vLLM's container (default vllm)")
    parser.add_argument(
        "--kubeconfig", type=Path, metavar="PATH", help="default: $KUBECONFIG, else ~/.kube/config, else in-cluster"
    )
    parser.add_argument("--json", action="store_true", help="list: the record as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        flags = [_flag(name) for name in args.flags]
    except ValueError as error:
        return _error(str(error))
    try:
        return asyncio.run(_run(args, flags))
    except RecordError as error:
        return _error(str(error))


async def _run(args: argparse.Namespace, flags: list[str]) -> int:
    target, close = _target(args)
    try:
        if args.action == "list":
            return await _list(target, as_json=bool(args.json))
        return await _change(target, args.action, flags)
    finally:
        await close()


def _target(args: argparse.Namespace) -> tuple[FlagsTarget, Callable[[], Awaitable[None]]]:
    """The record to work on and how to let go of it; RecordError when it cannot be reached."""
    if args.deployment is None:
        return RemediationStore(args.state_dir), _nothing
    from sidecar.actuators.kube_flags import kubectl_target  # noqa: PLC0415 - lightkube only for Kubernetes

    try:
        target, client = kubectl_target(
            deployment=args.deployment, namespace=args.namespace, container=args.container, kubeconfig=args.kubeconfig
        )
    except ValueError as error:  # credentials that cannot be had, a name Kubernetes would refuse
        raise RecordError(str(error)) from None
    return target, client.close


async def _nothing() -> None:
    return None


def _flag(name: str) -> str:
    flag = "--" + name.removeprefix("--")
    if flag not in REMEDIABLE:
        raise ValueError(f"{name}: not a flag the sidecar changes (one of: {', '.join(REMEDIABLE)})")
    return flag


async def _list(target: FlagsTarget, *, as_json: bool) -> int:
    steps = await target.read()
    if as_json:
        document = {
            "flags_file": target.where,
            "flags": flags_in_effect(steps),
            "steps": [_row(step) for step in steps],
        }
        print(json.dumps(document, indent=2))
        return 0
    if not steps:
        print(f"no change to vLLM's flags recorded in {target.where}")
        return 0
    for step in steps:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(step.wall_time_s))
        held = ", held" if step.held else ""
        print(f"{when}  {step.diff()}  ({step.cause})  {step.state}{held}")
        print(f"    why: {step.why}")
        if step.outcome:
            print(f"    {step.outcome}")
    print(_next_start(target, steps))
    return 0


def _next_start(target: FlagsTarget, steps: list[Step]) -> str:
    return f"vLLM's next start gets ({target.where}): {' '.join(flag_words(steps)) or 'none of the sidecar`s flags'}"


async def _change(target: FlagsTarget, action: str, flags: list[str]) -> int:
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

    steps = await target.update(edit)
    if not done:
        print(f"nothing to {action}: the sidecar {'sets' if action == 'revert' else 'holds'} none of these flags")
        return 1
    if action == "revert":
        when = (
            "the Deployment rolls out with it"
            if target.restarts_on_change
            else "restart vLLM to apply it now (else at its next start)"
        )
        print(f"reverted and held: {', '.join(done)}; {when}")
    else:
        print(f"released: {', '.join(done)}; the sidecar may change them again")
    print(_next_start(target, steps))
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
