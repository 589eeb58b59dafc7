"""`vllm-sidecar sim` options and entry point: every SimConfig field is a flag overriding the scenario."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import types
import typing
from typing import Any

_SKIPPED = {"scenario"}


def _flag_type(annotation: Any) -> tuple[Any, tuple[str, ...] | None]:
    """The argparse type (and choices) for a SimConfig field's annotation."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _flag_type(members[0])
    if typing.get_origin(annotation) is typing.Literal:
        return str, tuple(str(arg) for arg in typing.get_args(annotation))
    if annotation is bool:
        return _boolean, None
    return annotation, None


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sidecar.sim.config import SCENARIOS, SimConfig  # noqa: PLC0415 - keeps the CLI's start light

    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT to serve on (default 127.0.0.1:8000)")
    parser.add_argument("--scenario", default="healthy", choices=SCENARIOS, help="failure to reproduce")
    hints = typing.get_type_hints(SimConfig)
    for field in dataclasses.fields(SimConfig):
        if field.name in _SKIPPED:
            continue
        kind, choices = _flag_type(hints[field.name])
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=kind,
            choices=choices,
            default=None,
            help=f"overrides the scenario's value ({field.metadata.get('help', field.name)})",
        )


def run(args: argparse.Namespace) -> int:
    from sidecar.shell.address import split_listen  # noqa: PLC0415
    from sidecar.sim.config import SimConfig, scenario_config  # noqa: PLC0415
    from sidecar.sim.server import SimServer  # noqa: PLC0415

    overrides = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(SimConfig)
        if field.name not in _SKIPPED and getattr(args, field.name, None) is not None
    }
    try:
        host, port = split_listen(args.listen)
        config = scenario_config(args.scenario, **overrides)
    except ValueError as error:
        print(f"vllm-sidecar: error: sim: {error}", file=sys.stderr)
        return 2

    async def serve() -> int:
        server = SimServer(config, host=host, port=port, log=sys.stderr)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        try:
            return await server.run()
        except OSError as error:
            print(
                f"vllm-sidecar: error: sim cannot listen on {args.listen}: {error.strerror or error}", file=sys.stderr
            )
            return 1

    return asyncio.run(serve())
