"""Settings from a TOML or YAML config file (`--config FILE`, `VLLM_SIDECAR_CONFIG`), as a pydantic-settings
source for every command's model. Reads the file; no other I/O.

Keys may use '-' or '_'. One file serves every command: each reads the keys it has and leaves the keys another
command owns (`listen` is the daemon's; the doctor skips it), so `--config /etc/vllm-sidecar/config.toml` works
for `doctor` and `once` too. A key no command has is a `SettingsError` with the closest known one suggested. Apart from
`sidecar.shell.settings` so the simulator, an independent witness, can read its file without importing the
daemon's settings (which import the pure core's defaults).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sidecar.config.setting_origin import ENV_PREFIX, closest
from sidecar.file_cap import read_capped_file

MAX_CONFIG_BYTES = 1024 * 1024  # a settings file is a few hundred bytes; anything this big is the wrong file

# Every command's setting names: each command's model adds its own when it is defined (`FileBackedSettings`), and
# the CLI defines them all when it builds its parser, before any file is read.
EVERY_COMMANDS_SETTINGS: set[str] = set()
# The tables a file may group settings in, `[policy]` or `policy:`, with the settings each holds: the models a
# command's settings are composed of register theirs (a class attribute `section`). A setting in its table is the
# same as at the top; the flags and the environment name each setting alone.
SECTIONS: dict[str, frozenset[str]] = {}


class SettingsError(Exception):
    """A setting is invalid; the message is one line naming it and what it accepts."""


def config_path(flags: Mapping[str, Any], environ: Mapping[str, str]) -> Path | None:
    """The config file named by --config, else by VLLM_SIDECAR_CONFIG."""
    path = flags.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    return Path(path) if path else None


class ConfigFileSource(PydanticBaseSettingsSource):
    """Settings from a TOML or YAML file; keys may use '-' or '_'; an unknown key is an error."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._values = read_config_file(path, set(settings_cls.model_fields)) if path is not None else {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def read_config_file(path: Path, known: set[str]) -> dict[str, Any]:
    """The settings in `known` from a TOML or YAML file, keys normalised to `_`; a key of another command is
    left to it, and a key of none is an error."""
    try:
        text = read_capped_file(path, MAX_CONFIG_BYTES).decode("utf-8")
    except OSError as error:
        raise SettingsError(f"cannot read config file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise SettingsError(f"config file {path} is not UTF-8 text (byte {error.start})") from None
    try:
        if path.suffix.lower() == ".toml":
            document: object = tomllib.loads(text)
        else:
            document = yaml.safe_load(text) if text.strip() else {}
    # ValueError: an integer of over 4300 digits (Python's int() limit, hit inside both parsers; TOMLDecodeError
    # is one too); RecursionError: brackets nested thousands deep. Both are a bad file, not a crash.
    except (ValueError, yaml.YAMLError, RecursionError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SettingsError(f"config file {path} is not valid {_format_name(path)}: {first_line}") from None
    if not isinstance(document, dict):
        raise SettingsError(f"config file {path} must hold a table of settings, not {type(document).__name__}")
    values: dict[str, Any] = {}
    for key, name, value in _entries(document, path):
        if name not in known and name in EVERY_COMMANDS_SETTINGS and name != "config":
            continue
        if name not in known or name == "config":
            raise SettingsError(f"unknown setting {key!r} in config file {path}; {_suggestion(str(key), known)}")
        values[name] = value
    return values


def _entries(document: dict[Any, Any], path: Path) -> list[tuple[str, str, Any]]:
    """Each setting as written, its name with `_`, and its value: a section's table read as its settings."""
    entries: list[tuple[str, str, Any]] = []
    for key, value in document.items():
        name = str(key).replace("-", "_")
        if name not in SECTIONS or not isinstance(value, dict):
            entries.append((str(key), name, value))
            continue
        for inner_key, inner_value in value.items():
            inner = str(inner_key).replace("-", "_")
            if inner not in SECTIONS[name]:
                raise SettingsError(
                    f"unknown setting {inner_key!r} in [{key}] of config file {path}; "
                    f"{_suggestion(str(inner_key), set(SECTIONS[name]), tables=True)}"
                )
            entries.append((str(inner_key), inner, inner_value))
    seen: set[str] = set()
    for key, name, _ in entries:
        if name in seen:
            raise SettingsError(f"setting {key!r} is given twice in config file {path} (at the top and in its table)")
        seen.add(name)
    return entries


def _section_of(name: str) -> str | None:
    return next((section for section, names in SECTIONS.items() if name in names), None)


def _suggestion(key: str, known: set[str], *, tables: bool = False) -> str:
    """'did you mean ...?' in the key's own spelling (dashes or underscores), else the list of known keys."""
    candidates = sorted(known - {"config"})
    match = closest(key.replace("-", "_"), sorted((known | EVERY_COMMANDS_SETTINGS) - {"config"}))
    if match is not None:
        section = _section_of(match)
        where = f" (in [{section}])" if tables and section is not None and match not in known else ""
        return f"did you mean {(match.replace('_', '-') if '-' in key else match)!r}{where}?"
    return "known settings: " + ", ".join(candidates)


def _format_name(path: Path) -> str:
    return "TOML" if path.suffix.lower() == ".toml" else "YAML"


class FileBackedSettings(BaseSettings):
    """Settings read from the flags (given as init arguments), then `VLLM_SIDECAR_*` environment, then the
    `--config` file: the precedence every command shares."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        EVERY_COMMANDS_SETTINGS.update(cls.model_fields)
        for model in cls.__mro__:
            section = model.__dict__.get("section")
            if isinstance(section, str) and issubclass(model, BaseModel):
                SECTIONS[section] = frozenset(model.model_fields) - model.__dict__.get("top_level", frozenset())

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        flags: dict[str, Any] = getattr(init_settings, "init_kwargs", {})
        return (init_settings, env_settings, ConfigFileSource(settings_cls, config_path(flags, os.environ)))
