"""The `vllm-sidecar` command line: parses flags, loads settings, dispatches to the shell."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from sidecar import __version__
from sidecar.config.setting_origin import closest
from sidecar.config.settings_cli import settings_flags
from sidecar.shell.arguments import check_environment, option_actions
from sidecar.shell.settings import GROUP_ORDER, OnceSettings, Settings, SettingsError, load_settings

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with every usage error on one line (the usage itself is one --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"vllm-sidecar: error: {message} (see {self.prog} --help)\n")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """Every command's parser (a misspelt flag or variable is told apart from another command's). Built once per
    process: it reads nothing but the settings models, and parsing leaves it as it was."""
    parser = _Parser(
        prog="vllm-sidecar",
        description="Watches a vLLM server and its GPUs, derives what vLLM does not export, and re-exports it.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="the daemon: poll, derive, export; stops on SIGTERM/SIGINT")
    settings_flags(Settings, run, groups=GROUP_ORDER)
    once = commands.add_parser("once", help="one poll of vLLM and the GPUs, then exit")
    settings_flags(OnceSettings, once, groups=GROUP_ORDER)
    for name, help_text in _TOOL_COMMANDS:
        _tool(name).add_arguments(commands.add_parser(name, help=help_text))
    return parser


_TOOL_COMMANDS = (
    ("sim", "a simulated vLLM server (OpenAI API, /metrics, /health) on a simulated GPU"),
    ("demo", "the simulator and the daemon together on loopback, with a live view"),
    ("loadtest", "a peak-load profile against any OpenAI-compatible server, with a verdict"),
    ("wait-gpu", "wait until no vLLM process holds GPU memory (run before vLLM starts: ExecStartPre=)"),
    ("doctor", "diagnose OOM root causes from vLLM, the GPUs, a log and history; recommend vLLM flags"),
    ("remediations", "list or revert what --remediate changed in vLLM's flags"),
)


def _tool(name: str) -> ModuleType:
    """A tool command's module (`add_arguments`, `run`), imported when its parser is built: each import is
    written out, so the import contracts see them, and none is loaded before a command line needs it."""
    if name == "sim":
        from sidecar.sim import command as sim  # noqa: PLC0415

        return sim
    if name == "demo":
        from sidecar.demo import command as demo  # noqa: PLC0415

        return demo
    if name == "loadtest":
        from sidecar.loadtest import command as loadtest  # noqa: PLC0415

        return loadtest
    if name == "wait-gpu":
        from sidecar.shell import wait_gpu  # noqa: PLC0415

        return wait_gpu
    if name == "remediations":
        from sidecar.shell import remediations_command  # noqa: PLC0415

        return remediations_command
    from sidecar.doctor_cli import command as doctor  # noqa: PLC0415

    return doctor


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    return dict(_commands(parser)).get(name)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, with a flag argparse does not know answered by the closest one the command has."""
    namespace, extras = parser.parse_known_args(argv)
    if extras:
        command = _subparser(parser, argv[0]) if argv else None
        where = command if command is not None else parser
        unknown = extras[0].split("=", 1)[0]
        if not unknown.startswith("-"):
            where.error(f"unexpected argument {extras[0]!r}")
        flags = [flag for action in where._actions for flag in action.option_strings]
        match = closest(unknown, flags)
        owners = [name for name, other in _commands(parser) if other is not where and _has_flag(other, unknown)]
        if match is None and owners:  # `once --listen`: the daemon's option, not a typo
            where.error(f"{unknown} is an option of {' and '.join(owners)}, not of {argv[0]}")
        where.error(f"unknown flag {unknown}" + (f"; did you mean {match}?" if match is not None else ""))
    return namespace


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse offers no public way to reach a subparser
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _has_flag(parser: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in action.option_strings for action in parser._actions)


def _check_environment(parser: argparse.ArgumentParser, command: str) -> None:
    """A misspelt VLLM_SIDECAR_* variable of this command: the option names of every command are known."""
    everything: dict[str, set[str]] = {}
    for action in parser._actions:  # argparse offers no public way to reach a subparser
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                everything[name] = set(option_actions(sub))
    own = everything.get(command, set())
    check_environment(os.environ, own, set().union(*everything.values()) - own)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    tool = _subparser(parser, argv[0]) if argv and argv[0] in {name for name, _ in _TOOL_COMMANDS} else None
    if tool is not None:
        module = _tool(argv[0])
        try:
            _check_environment(parser, argv[0])  # the command's settings model reads the environment and file
        except SettingsError as error:
            print(f"vllm-sidecar: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        args = _parse(parser, argv)
        return int(module.run(args))
    arguments = vars(_parse(parser, argv))
    command = arguments.pop("command")
    flags: dict[str, Any] = {name: value for name, value in arguments.items() if value is not None}
    try:
        _check_environment(parser, command)
        if command == "once":
            return _once(load_settings(flags, OnceSettings))
        settings = load_settings(flags)
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    from sidecar.shell.logging import configure_logging  # noqa: PLC0415 - keeps --help and --version fast

    configure_logging(level=settings.log_level, log_format=settings.log_format)
    from sidecar.shell.daemon import Daemon  # noqa: PLC0415

    async def _run() -> int:
        try:
            daemon = Daemon(settings)
            await daemon.check_start()  # the platform's answers: a unit systemd does not know stops it here
        except SettingsError as error:  # found while building the adapter or the notifier, or asking the platform
            print(f"vllm-sidecar: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        return await daemon.run()

    return asyncio.run(_run())


def _once(settings: OnceSettings) -> int:
    from sidecar.shell.logging import configure_logging  # noqa: PLC0415 - keeps --help and --version fast
    from sidecar.shell.once import run_once  # noqa: PLC0415

    # What a single poll finds is in its output (problems); logging it too would only repeat it.
    configure_logging(level="critical", log_format=settings.log_format)
    code, output, error_line = run_once(settings, as_json=settings.json)
    print(output)
    if error_line is not None:
        print(error_line, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
