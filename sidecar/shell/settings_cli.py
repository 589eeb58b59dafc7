"""A command's flags from pydantic-settings' own CLI (`CliSettingsSource`), on the command's argparse parser. No I/O.

pydantic-settings declares one flag per setting of the model, named after it in kebab case (`--vllm-url`), with
the setting's description, default and environment variable in its help, and reads the flags given back as the
top layer of the model's sources: flag > `VLLM_SIDECAR_*` > config file > default. The command's parser stays
the CLI's (`sidecar.cli`): its usage errors are one line with exit code 2, and an unknown flag gets the closest
one suggested.

Two tunings, through the source's `add_argument_method` hook:
- A boolean setting takes `--dry-run` alone (true) as well as `--dry-run=false` or `--dry-run no`. The library's
  explicit flags need a value, and its implicit ones (`--dry-run`/`--no-dry-run`) refuse `--dry-run=false`;
  deployed manifests use both forms.
- The help says what a setting accepts, in the words its error line uses (`allowed` in the field's schema extra).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
# What pydantic reads as a bool from text (also t|f, y|n): a flag's value is read like an environment variable's.
BOOLEAN_FORMS = "true|false, 1|0, yes|no, on|off"
_OPTIONS: dict[str, Any] = {
    "cli_kebab_case": True,  # --vllm-url, as before the library declared the flags
    "cli_implicit_flags": False,  # a bool takes a value; `_add_argument` lets it stand alone too
    "cli_show_env_vars": True,  # the help names each flag's VLLM_SIDECAR_* variable
    "cli_exit_on_error": False,  # the CLI's own parser words the errors
}


def settings_flags(model: type[SettingsT], parser: argparse.ArgumentParser) -> CliSettingsSource[SettingsT]:
    """Declare `model`'s flags on `parser`; the source reads them back (`load_flags`)."""

    def add_argument(target: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
        field = model.model_fields.get(str(kwargs.get("dest", "")))
        return target.add_argument(*names, **(_tuned(field, names[0], kwargs) if field is not None else kwargs))

    return CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument, **_OPTIONS)


def load_flags(
    model: type[SettingsT], flags: Mapping[str, Any], source: CliSettingsSource[SettingsT] | None = None
) -> SettingsT:
    """`model` with `flags` (what the parser collected, by setting name) as its CLI layer; without `source`,
    the library's own parser for `model`, as `settings_flags` would declare it, reads them."""
    cli = source if source is not None else CliSettingsSource(model, **_OPTIONS)
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
    if "allowed" in extra and help_text.startswith(description):
        allowed = str(extra["allowed"]).replace("%", "%%")  # argparse formats help with %: a literal one doubled
        return {**kwargs, "help": f"{description} ({allowed}){help_text[len(description) :]}"}
    return kwargs
