"""Settings loaded from the flags, the environment and the config file, and their errors in one line. Reads the
environment and the config file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, overload
from urllib.parse import urlsplit

from pydantic import ValidationError

from sidecar.config.accepted import accepted
from sidecar.config.config_file import SettingsError, config_path, read_config_file
from sidecar.config.setting_origin import Origin, flag_of, origins
from sidecar.config.settings_cli import load_flags
from sidecar.shell.setting_conflict import ConflictError, blame, shown
from sidecar.shell.settings.reading import ScrapeSettings
from sidecar.shell.settings.run import Settings

SECRET_SETTINGS = frozenset({"webhook_url"})  # never echoed in errors, logs or /status
SettingsT = TypeVar("SettingsT", bound=ScrapeSettings)


def core_values(settings: ScrapeSettings, core: Literal["policy", "derive"]) -> dict[str, Any]:
    """The values of the settings that feed `PolicySettings` or `DeriveSettings`, by the core's field names:
    the mapping is the one each setting declares (`_policy`, `_derive`), so no second list can fall behind."""
    values: dict[str, Any] = {}
    for name, field in type(settings).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        target = extra.get(core)
        if isinstance(target, str):
            values[target] = getattr(settings, name)
    return values


@overload
def load_settings(flags: Mapping[str, Any]) -> Settings: ...
@overload
def load_settings(flags: Mapping[str, Any], model: type[SettingsT]) -> SettingsT: ...
def load_settings(flags: Mapping[str, Any], model: type[ScrapeSettings] = Settings) -> ScrapeSettings:
    """Build `model` (run's settings unless told) from the flags (pydantic-settings' CLI on the command's
    parser collected them), the environment and the config file; raise `SettingsError` with one line naming the
    first bad setting and where it was set."""
    names = set(model.model_fields)
    path = config_path(flags, os.environ)
    file_keys = read_config_file(path, names) if path is not None else {}
    found = origins(names, flags=flags, environ=os.environ, config_file=path, file_keys=set(file_keys))
    try:
        settings = load_flags(model, flags)
    except ValidationError as error:
        raise SettingsError(_describe(model, error, found)) from None
    settings._origins = found  # the model's own private attribute, set once, by its factory
    return settings


def setting_error(settings: ScrapeSettings, name: str, why: str, *, allowed: bool = True) -> SettingsError:
    """An error about a setting found after loading (a directory that cannot be written), in the same words.
    `allowed=False` leaves out what the setting accepts: for a value of the right form that the machine refuses
    (a systemd unit it does not know), where `why` already says what to do."""
    given = "" if name in SECRET_SETTINGS else f"={shown(getattr(settings, name))!r}"
    return SettingsError(_line(type(settings), name, given, why, settings.origin(name), allowed=allowed))


def _without_userinfo(value: object) -> object:
    """A URL-looking value with its `user:password@` replaced: an error must not repeat a password."""
    if not isinstance(value, str) or "@" not in value:
        return value
    try:
        parts = urlsplit(value)
    except ValueError:
        return "<not shown: it may hold a password>"
    if parts.username is None and parts.password is None:
        return value
    return parts._replace(netloc="…@" + parts.netloc.rpartition("@")[2]).geturl()


def _describe(model: type[ScrapeSettings], error: ValidationError, found: Mapping[str, Origin]) -> str:
    first = error.errors()[0]
    conflict = first.get("ctx", {}).get("error")
    if isinstance(conflict, ConflictError):
        blamed = blame(conflict, found)
        name, message = blamed.setting, blamed.message
        given = "" if name in SECRET_SETTINGS or blamed.value is None else f"={shown(blamed.value)!r}"
    else:
        name = str(first["loc"][0]) if first["loc"] else "settings"
        shown_input = name in model.model_fields and name not in SECRET_SETTINGS
        given = (
            f"={_without_userinfo(first['input'])!r}" if shown_input and not isinstance(first["input"], dict) else ""
        )
        message = str(first["msg"]).removeprefix("Value error, ")
    return _line(model, name, given, message, found.get(name) or Origin(setting=name, layer=None))


def _line(
    model: type[ScrapeSettings], name: str, given: str, message: str, origin: Origin, *, allowed: bool = True
) -> str:
    field = model.model_fields.get(name)
    words = accepted(field) if field is not None and allowed else None
    accepts = f"; allowed: {words}" if words else ""
    if field is not None and field.annotation is bool and allowed:  # the forms pydantic reads, the help shows too
        accepts += f" (a bare {flag_of(name)} means true)"
    return f"invalid setting {name}{given}: {message}{accepts} ({origin.describe()})"
