"""The `vllm-sidecar` command line: parses flags, loads settings, dispatches to the shell."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from sidecar import __version__
from sidecar.shell.arguments import apply_defaults
from sidecar.shell.settings import Settings, SettingsError, load_settings

EXIT_USAGE = 2


def _settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, named after it; unset flags stay out so lower layers can fill them."""
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        # argparse formats help with %: a literal percent sign must be doubled.
        help_text = f"{field.description} ({extra.get('allowed', '')}; default {field.default!s})".replace("%", "%%")
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action="store_const", const=True, default=argparse.SUPPRESS, help=help_text
            )
        else:
            parser.add_argument(flag, dest=name, metavar=name.upper(), default=argparse.SUPPRESS, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-sidecar",
        description="Watches a vLLM server and its GPUs, derives what vLLM does not export, and re-exports it.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="the daemon: poll, derive, export; stops on SIGTERM/SIGINT")
    _settings_flags(run)
    once = commands.add_parser("once", help="one poll of vLLM and the GPUs, then exit")
    once.add_argument("--json", action="store_true", help="print the JSON document of the contract")
    _settings_flags(once)
    for name, help_text, module in _TOOL_COMMANDS:
        tool = commands.add_parser(name, help=help_text)
        tool.add_argument("--config", help="TOML or YAML file with options (flag > environment > file > default)")
        importlib.import_module(module).add_arguments(tool)
    return parser


_TOOL_COMMANDS = (
    ("sim", "a simulated vLLM server (OpenAI API, /metrics, /health) on a simulated GPU", "sidecar.sim.command"),
    ("demo", "the simulator and the daemon together on loopback, with a live view", "sidecar.demo.command"),
    (
        "loadtest",
        "a peak-load profile against any OpenAI-compatible server, with a verdict",
        "sidecar.loadtest.command",
    ),
    (
        "doctor",
        "diagnose OOM root causes from vLLM, the GPUs, a log and history; recommend vLLM flags",
        "sidecar.doctor.command",
    ),
)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # argparse offers no public way to reach a subparser
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(name)
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    tool = _subparser(parser, argv[0]) if argv and argv[0] in {name for name, _, _ in _TOOL_COMMANDS} else None
    if tool is not None:
        try:
            apply_defaults(tool, argv[1:])
        except SettingsError as error:
            print(f"vllm-sidecar: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        args = parser.parse_args(argv)
        modules = {name: module for name, _, module in _TOOL_COMMANDS}
        return int(importlib.import_module(modules[argv[0]]).run(args))
    arguments = vars(parser.parse_args(argv))
    command = arguments.pop("command")
    as_json = bool(arguments.pop("json", False))
    flags: dict[str, Any] = arguments
    try:
        settings = load_settings(flags)
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    from sidecar.shell.logging import configure_logging  # noqa: PLC0415 - keeps --help and --version fast

    if command == "once":
        # What a single poll finds is in its output (problems); logging it too would only repeat it.
        configure_logging(level="critical", log_format=settings.log_format)
        from sidecar.shell.once import run_once  # noqa: PLC0415

        code, output, error_line = run_once(settings, as_json=as_json)
        print(output)
        if error_line is not None:
            print(error_line, file=sys.stderr)
        return code
    configure_logging(level=settings.log_level, log_format=settings.log_format)
    from sidecar.shell.daemon import Daemon  # noqa: PLC0415

    async def _run() -> int:
        try:
            daemon = Daemon(settings)
        except SettingsError as error:  # found while building the adapter or the notifier
            print(f"vllm-sidecar: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        return await daemon.run()

    return asyncio.run(_run())


if __name__ == "__main__":
    sys.exit(main())
