"""A command's flags from pydantic-settings' own CLI (`CliSettingsSource`), on the command's argparse parser. No I/O.

pydantic-settings declares one flag per setting of the model, named after it in kebab case (`--vllm-url`), with
the setting's description, default and environment variable in its help, and reads the flags given back as the
top layer of the model's sources: flag > `VLLM_SIDECAR_*` > config file > default. The command's parser stays
the CLI's (`sidecar.cli`): its usage errors are one line with exit code 2, and an unknown flag gets the closest
one suggested.

Three tunings, through the source's `add_argument_method` hook (`_tuned`):
- A boolean setting takes `--dry-run` alone (true) as well as `--dry-run=false` or `--dry-run no`. The library's
  explicit flags need a value, and its implicit ones (`--dry-run`/`--no-dry-run`) refuse `--dry-run=false`;
  deployed manifests use both forms.
- An enum setting's flag takes the members' values (`--scenario hang-idle`), which its help lists, as the
  environment and the config file do; the library lists the members' names.
- The help says what a setting accepts, in the words its error line uses (`allowed` in the field's schema extra).
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
# What pydantic reads as a bool from text (also t|f, y|n): a flag's value is read like an environment variable's.
BOOLEAN_FORMS = "true|false, 1|0, yes|no, on|off"
_OPTIONS: dict[str, Any] = {
    "cli_kebab_case": True,  # --vllm-url, as before the library declared the flags
    "cli_implicit_flags": False,  # a bool takes a value; `_tuned` lets it stand alone too
    "cli_show_env_vars": True,  # the help names each flag's VLLM_SIDECAR_* variable
    "cli_exit_on_error": False,  # the CLI's own parser words the errors
}


def settings_flags(
    model: type[SettingsT], parser: argparse.ArgumentParser, *, shortcuts: Mapping[str, str] | None = None
) -> None:
    """Declare `model`'s flags on `parser`; `shortcuts`: a setting's other flag name (`--timeout` for
    `request_timeout`), for the command line only (its environment variable keeps the setting's name)."""

    def add_argument(target: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
        field = model.model_fields.get(str(kwargs.get("dest", "")))
        return target.add_argument(*names, **(_tuned(field, names[0], kwargs) if field is not None else kwargs))

    # The library keys a shortcut by the flag's name as it writes it (kebab case), not by the setting's.
    by_flag = {name.replace("_", "-"): other for name, other in (shortcuts or {}).items()}
    CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument, cli_shortcuts=by_flag, **_OPTIONS)


def load_flags(model: type[SettingsT], flags: Mapping[str, Any]) -> SettingsT:
    """`model` with `flags` (what the command's parser collected, by setting name) as its top source, read by
    the library's CLI source for `model`."""
    cli: CliSettingsSource[SettingsT] = CliSettingsSource(model, **_OPTIONS)
    # The config file's source finds `--config` among the init values (`config_file.FileBackedSettings`).
    config = {"config": flags["config"]} if "config" in flags else {}
    return model(_cli_settings_source=cli(parsed_args=dict(flags)), **config)


def _tuned(field: FieldInfo, flag: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    help_text = str(kwargs.get("help", ""))
    description = (field.description or "").replace("%", "%%")  # as the library wrote it into the help
    if field.annotation is bool:
        forms = f"{flag} alone means true; {flag}={BOOLEAN_FORMS}"
        return {**kwargs, "nargs": "?", "const": "true", "metavar": "BOOL", "help": f"{help_text}; {forms}"}
    enum = _enum_in(field.annotation)
    if enum is not None:
        # The library shows an enum's member names (LEAK) and reads names or values; the values are what the
        # environment, the config file and every document use: argparse lists them and refuses any other.
        if isinstance(field.default, enum):
            help_text = help_text.replace(f"(default: {field.default.name})", f"(default: {field.default.value})")
        kwargs = {**kwargs, "choices": [str(member.value) for member in enum], "metavar": None, "help": help_text}
    if "allowed" in extra and help_text.startswith(description):
        allowed = str(extra["allowed"]).replace("%", "%%")  # argparse formats help with %: a literal one doubled
        return {**kwargs, "help": f"{description} ({allowed}){help_text[len(description) :]}"}
    return kwargs


def _enum_in(annotation: object) -> type[Enum] | None:
    """The enum of a setting's type (`Scenario`, `VllmVersion | None`), or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
    return None
