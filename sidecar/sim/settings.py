"""`vllm-sidecar sim`'s settings: one pydantic-settings model, read from flags, the environment and a config file.

Reads the environment and the config file. Every `SimConfig` field is a setting that overrides the scenario's
preset (None: the preset's value), beside where to listen and which scenario. pydantic-settings layers them
(flag > `VLLM_SIDECAR_<OPTION>` > `--config` file > the preset) and parses each value for its field's type, so
a boolean takes the same forms as the daemon's. A bad value is a `SettingsError` of one line naming the setting
and where it came from. The simulator stays an independent witness: nothing here imports the sidecar's parsing,
derivation or policy.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, create_model, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sidecar.shell.address import split_listen
from sidecar.shell.config_file import ConfigFileSource, SettingsError, config_path, read_config_file
from sidecar.shell.setting_origin import ENV_PREFIX, Origin, origins
from sidecar.sim.config import Scenario, SimConfig

# The settings that are not SimConfig overrides.
OWN = frozenset({"config", "listen", "scenario"})


class _SimSettingsBase(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    config: Path | None = Field(None, description="TOML or YAML file with options")
    listen: str = Field("127.0.0.1:8000", description="HOST:PORT to serve on (default 127.0.0.1:8000)")
    scenario: Scenario = Field(Scenario.HEALTHY, description="failure to reproduce")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_listen(value)
        return value

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

    def overrides(self) -> dict[str, Any]:
        """The SimConfig fields set anywhere (flag, environment, file), to apply on top of the scenario's preset."""
        return {name: value for name, value in self if name not in OWN and value is not None}


def _overrides() -> dict[str, Any]:
    """Each SimConfig field (but the scenario) as an optional setting: its type is the field's, None the preset's."""
    hints = typing.get_type_hints(SimConfig)
    return {
        field.name: (
            hints[field.name] | None,
            Field(None, description=f"overrides the scenario's value ({field.name})"),
        )
        for field in dataclasses.fields(SimConfig)
        if field.name not in OWN
    }


SimSettings = create_model("SimSettings", __base__=_SimSettingsBase, **_overrides())


def load_sim_settings(flags: dict[str, Any]) -> _SimSettingsBase:
    """The sim's settings from `flags` (the options given), the environment and the config file; `SettingsError`
    with one line naming the first bad setting and where its value came from."""
    names = set(SimSettings.model_fields)
    path = config_path(flags, os.environ)
    file_keys = read_config_file(path, names) if path is not None else {}
    found = origins(names, flags=flags, environ=os.environ, config_file=path, file_keys=set(file_keys))
    try:
        return SimSettings(**flags)
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        origin = found.get(name) or Origin(setting=name, layer=None)
        raise SettingsError(f"invalid setting {name}={first['input']!r}: {message} ({origin.describe()})") from None
