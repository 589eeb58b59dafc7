"""Environment and config-file defaults for the argparse-based commands (sim, loadtest, demo).

The contract: every option is also read from `VLLM_SIDECAR_<OPTION>` and from `--config FILE` (TOML or
YAML), with flag > environment > file > default. argparse parses a string default exactly like a command
line value, so the environment's strings go through the same type checks as flags; a bad one is reported
here first, naming the variable or the file it came from. Also for every command: a `VLLM_SIDECAR_*`
variable that names nothing but is a letter or two off an option is an error with the option suggested.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from sidecar.shell.setting_origin import closest, environment_of, flag_of
from sidecar.shell.settings import ENV_PREFIX, SettingsError, read_config_file

# Names under the prefix that are no command's option: the config file; what the exec adapter passes to its
# command; the allocator probe's, read inside vLLM's processes (see the contract).
RESERVED_NAMES = frozenset({"config", "restart_reason", "probe_dir", "probe_interval"})


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by destination, without help/version/config."""
    return {
        action.dest: action
        for action in parser._actions  # argparse offers no public list of a parser's actions
        if action.option_strings and action.dest not in ("help", "version", "config")
    }


def apply_defaults(parser: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str] | None = None) -> None:
    """Set each option's default from the environment, else from the --config file in `argv`."""
    environ = os.environ if environ is None else environ
    actions = option_actions(parser)
    path, file_values = _config_values(argv, environ, set(actions))
    for dest, action in actions.items():
        env_value = environ.get(ENV_PREFIX + dest.upper())
        if env_value is not None:
            action.default = _from_text(action, env_value, f"environment {ENV_PREFIX}{dest.upper()}")
        elif dest in file_values:
            value = file_values[dest]
            action.default = _from_text(action, value, f"config file {path}") if isinstance(value, str) else value


def check_environment(environ: Mapping[str, str], own: Collection[str], elsewhere: Collection[str]) -> None:
    """Refuse a `VLLM_SIDECAR_*` variable that names no option of any command but is close to one of this
    command's (`own`): a misspelt setting would otherwise be ignored without a word. Variables close to
    nothing are left alone: test harnesses and deployments use the prefix for their own names too."""
    known = {name.upper() for name in (*own, *elsewhere, *RESERVED_NAMES)}
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper.removeprefix(ENV_PREFIX) in known:
            continue
        match = closest(upper.removeprefix(ENV_PREFIX).lower(), own)
        if match is not None:
            raise SettingsError(
                f"unknown environment variable {variable}: no setting has that name; "
                f"did you mean {environment_of(match)} ({flag_of(match)})?"
            )


def _config_values(argv: list[str], environ: Mapping[str, str], known: set[str]) -> tuple[Path | None, dict[str, Any]]:
    path = None
    for index, argument in enumerate(argv):
        if argument == "--config" and index + 1 < len(argv):
            path = argv[index + 1]
        elif argument.startswith("--config="):
            path = argument.split("=", 1)[1]
    path = path or environ.get(ENV_PREFIX + "CONFIG")
    return (Path(path), read_config_file(Path(path), known)) if path else (None, {})


def _from_text(action: argparse.Action, text: str, origin: str) -> Any:
    if action.nargs == 0:  # store_true / store_const flags
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise SettingsError(f"invalid setting {action.dest}={text!r} from {origin}: expected true or false")
    if action.choices is not None and text not in action.choices:
        allowed = ", ".join(str(choice) for choice in action.choices)
        raise SettingsError(f"invalid setting {action.dest}={text!r} from {origin}; allowed: {allowed}")
    if action.type in (int, float):
        try:
            action.type(text)  # what argparse does with the default later, but with the origin in the error
        except ValueError:
            kind = "an integer" if action.type is int else "a number"
            raise SettingsError(f"invalid setting {action.dest}={text!r} from {origin}: not {kind}") from None
    return text
