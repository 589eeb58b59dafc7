"""The settings of the tool commands (sim, loadtest, demo, doctor): one pydantic-settings model per command.

Reads the environment and the config file. Each command's model declares its options with their types, defaults
and help; pydantic-settings' CLI declares the flags from it (`settings_cli.settings_flags`) and layers flag >
`VLLM_SIDECAR_<OPTION>` > `--config` file > the model's default, parsing each value for its type, so a boolean
takes the daemon's forms. A bad value is a `SettingsError` of one line naming the setting, the value and where
it came from.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from sidecar.config.accepted import accepted, choices, unit
from sidecar.config.config_file import FileBackedSettings, SettingsError, config_path, read_config_file
from sidecar.config.setting_origin import ENV_PREFIX, Origin, origins
from sidecar.config.settings_cli import load_flags

ToolSettingsT = TypeVar("ToolSettingsT", bound="ToolSettings")


class ToolSettings(FileBackedSettings):
    """A tool command's options: flags, then the environment, then the config file."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True, protected_namespaces=()
    )

    config: Path | None = Field(None, description="TOML or YAML file with options")


# pydantic warns that a field named `json` shadows BaseModel.json(), a deprecated method nothing here calls; the
# option is --json (VLLM_SIDECAR_JSON), so the name stays, declared once, here.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "json"', category=UserWarning)

    class ReportSettings(ToolSettings):
        """A tool that prints a report, as text or (`--json`) as one JSON document."""

        json: bool = Field(False, description="print the report as one JSON document")  # type: ignore[assignment]


def given(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The options the user gave on the command line (argparse keeps no entry for the others)."""
    values = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    return {name: value for name, value in values.items() if name != "command" and value is not None}


def load_tool_settings(model: type[ToolSettingsT], args: argparse.Namespace | Mapping[str, Any]) -> ToolSettingsT:
    """`model` from the flags in `args`, the environment and the config file; `SettingsError` with one line
    naming the first bad setting, its value and where it came from."""
    flags = given(args)
    names = set(model.model_fields)
    path = config_path(flags, os.environ)
    file_keys = read_config_file(path, names) if path is not None else {}
    found = origins(names, flags=flags, environ=os.environ, config_file=path, file_keys=set(file_keys))
    try:
        return load_flags(model, flags)
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        origin = found.get(name) or Origin(setting=name, layer=None)
        field = model.model_fields.get(name)
        words = accepted(field) if field is not None else None
        # "a number" after "Input should be a valid number", or the choices pydantic's message lists, repeat it:
        # only a range or a form adds to it.
        repeats = field is None or words == unit(field) or bool(choices(field))
        allowed = f"; allowed: {words}" if words and not repeats else ""
        raise SettingsError(
            f"invalid setting {name}={first['input']!r}: {message}{allowed} ({origin.describe()})"
        ) from None
