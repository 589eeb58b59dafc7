"""A command's flags from pydantic-settings' own CLI (`CliSettingsSource`), on the command's argparse parser. No I/O.

pydantic-settings declares one flag per setting of the model, named after it in kebab case (`--vllm-url`), with
the setting's description, default and environment variable in its help, and reads the flags given back as the
top layer of the model's sources: flag > `VLLM_SIDECAR_*` > config file > default. The command's parser stays
the CLI's (`sidecar.cli`): its usage errors are one line with exit code 2, and an unknown flag gets the closest
one suggested.

Its tunings, through the source's `add_argument_method` hook (`_tuned`):
- A boolean setting takes `--dry-run` alone (true) as well as `--dry-run=false` or `--dry-run no`. The library's
  explicit flags need a value, and its implicit ones (`--dry-run`/`--no-dry-run`) refuse `--dry-run=false`;
  deployed manifests use both forms.
- An enum setting's flag takes the members' values (`--scenario hang-idle`), which its help lists, as the
  environment and the config file do; the library lists the members' names.
- The help is one line per setting where it fits: a placeholder by unit (`--interval SECONDS`, `sidecar.config.
  accepted`), the default as a user writes it (`(default 2)`), in the help group the field names; the environment
  variables and the boolean forms are said once, below. What a setting accepts is in its error line and in
  docs/settings.md, both worded from the field.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource

from sidecar.config.accepted import BOOLEAN_FORMS, choices, extra_of, metavar, value_type
from sidecar.config.setting_origin import SHORT_FLAGS

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
_OPTIONS: dict[str, Any] = {
    "cli_kebab_case": True,  # --vllm-url, as before the library declared the flags
    "cli_implicit_flags": False,  # a bool takes a value; `_tuned` lets it stand alone too
    "cli_show_env_vars": False,  # said once, in the epilog: one line per option would double the help
    "cli_exit_on_error": False,  # the CLI's own parser words the errors
}
EPILOG = (
    "Each option is also VLLM_SIDECAR_<OPTION> in the environment and a key of the --config file; a flag wins "
    f"over both. A boolean alone means true, or takes {BOOLEAN_FORMS}. Ranges: docs/settings.md."
)


def settings_flags(
    model: type[SettingsT],
    parser: argparse.ArgumentParser,
    *,
    shortcuts: Mapping[str, str] | None = None,
    groups: Sequence[str] = (),
) -> None:
    """Declare `model`'s flags on `parser`, each in the help group its field names (`groups`: their order);
    `shortcuts`: a setting's other flag name (`--timeout` for `request_timeout`), for the command line only
    (its environment variable keeps the setting's name)."""
    sections = {title: parser.add_argument_group(title) for title in groups[1:]}
    if groups:
        # The first group is argparse's own, which holds --help: one group fewer on the screen. argparse offers
        # no public way to name it.
        parser._optionals.title = groups[0]
        sections[groups[0]] = parser._optionals

    def add_argument(target: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
        field = model.model_fields.get(str(kwargs.get("dest", "")))
        if field is None:
            return target.add_argument(*names, **kwargs)
        group = extra_of(field).get("group")
        where: argparse._ActionsContainer = target
        if target is parser and isinstance(group, str):
            where = sections.get(group, target)
        return where.add_argument(*names, **_tuned(field, names[0], kwargs))

    # The library keys a shortcut by the flag's name as it writes it (kebab case), not by the setting's.
    by_flag = {name.replace("_", "-"): other for name, other in (shortcuts or {}).items()}
    SHORT_FLAGS.update({name: "--" + other for name, other in (shortcuts or {}).items()})
    CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument, cli_shortcuts=by_flag, **_OPTIONS)
    parser.usage = "%(prog)s [OPTION ...]"  # the full list is the help's: a usage of 40 lines helps nobody
    parser.epilog = EPILOG
    parser.formatter_class = _Formatter


class _Formatter(argparse.HelpFormatter):
    """The option's help beside it where it fits (argparse's default moves it below after 24 columns)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def _with_default(field: FieldInfo) -> str:
    """The field's one line of help and its default as a user writes it: `(default 2)`, not the library's
    `(default: 2.0)`; nothing for an unset default, which the line itself explains."""
    description = (field.description or "").replace("%", "%%")  # argparse formats help with %
    default = field.default
    if default is None or "(default" in description:
        return description
    if isinstance(default, bool):
        shown = "on" if default else "off"
    elif isinstance(default, Enum):
        shown = str(default.value)
    elif isinstance(default, float):
        shown = f"{default:g}"
    else:
        shown = str(default)
    return f"{description} (default {shown})".replace("%", "%%") if "%" in shown else f"{description} (default {shown})"


def load_flags(model: type[SettingsT], flags: Mapping[str, Any]) -> SettingsT:
    """`model` with `flags` (what the command's parser collected, by setting name) as its top source, read by
    the library's CLI source for `model`."""
    cli: CliSettingsSource[SettingsT] = CliSettingsSource(model, **_OPTIONS)
    # The config file's source finds `--config` among the init values (`config_file.FileBackedSettings`).
    config = {"config": flags["config"]} if "config" in flags else {}
    return model(_cli_settings_source=cli(parsed_args=dict(flags)), **config)


def _tuned(field: FieldInfo, flag: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    help_text = _with_default(field)
    if field.annotation is bool:
        return {**kwargs, "nargs": "?", "const": "true", "metavar": "BOOL", "help": help_text}
    listed = choices(field)
    kind = value_type(field)
    if listed and isinstance(kind, type) and issubclass(kind, Enum):
        # The library shows an enum's member names (LEAK) and reads names or values; the values are what the
        # environment, the config file and every document use: argparse lists them and refuses any other.
        return {**kwargs, "choices": list(listed), "metavar": None, "help": help_text}
    if listed:  # a Literal: pydantic refuses another value, in the one-line error every setting gets
        return {**kwargs, "metavar": "{" + ",".join(listed) + "}", "help": help_text}
    placeholder = metavar(field)
    if placeholder == "TEXT" and flag.endswith("url"):  # a tool's --url, --vllm-url, --readiness-url
        placeholder = "URL"
    return {**kwargs, "metavar": placeholder, "help": help_text}
