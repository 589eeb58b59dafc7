"""The `vllm-sidecar` command line: parses flags, loads settings, dispatches to the shell."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from sidecar import __version__
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = vars(build_parser().parse_args(argv))
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
        return await Daemon(settings).run()

    return asyncio.run(_run())


if __name__ == "__main__":
    sys.exit(main())
