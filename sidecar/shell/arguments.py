"""The options of every command's parser, and misspelt `VLLM_SIDECAR_*` variables. No I/O.

Each command's settings model reads its options from the environment and the config file (pydantic-settings:
`sidecar/shell/settings.py` for run and once, `sidecar/config/tool_settings.py` for the tools). What is left
here spans the commands: a `VLLM_SIDECAR_*` variable that names no option of any command but is a letter or two
off one of this command's is an error with the option suggested.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping

from sidecar.config.setting_origin import closest, environment_of, flag_of
from sidecar.shell.settings import ENV_PREFIX, SettingsError

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
