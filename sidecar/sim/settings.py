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
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import Field, create_model, field_validator

from sidecar.config.address import split_listen
from sidecar.config.tool_settings import ToolSettings, load_tool_settings
from sidecar.sim.config import Scenario, SimConfig

# The settings that are not SimConfig overrides.
OWN = frozenset({"config", "sim_listen", "scenario"})


class _SimSettingsBase(ToolSettings):
    # Not `listen`: that is the daemon's address, and VLLM_SIDECAR_LISTEN set for it must not move the simulator
    # onto the sidecar's port; --listen is its flag.
    sim_listen: str = Field("127.0.0.1:8000", description="HOST:PORT to serve on")
    scenario: Scenario = Field(Scenario.HEALTHY, description="failure to reproduce")

    @field_validator("sim_listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_listen(value)
        return value

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


def load_sim_settings(flags: Mapping[str, Any]) -> _SimSettingsBase:
    """The sim's settings from `flags` (the options given), the environment and the config file; `SettingsError`
    with one line naming the first bad setting and where its value came from."""
    return load_tool_settings(SimSettings, flags)
