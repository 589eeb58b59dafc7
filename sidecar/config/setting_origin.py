"""Where each setting's value came from (a flag, an environment variable, a config file, the default), so
an error can blame what the user actually wrote; and the closest known name for a misspelt one. No I/O.

The layering itself is pydantic-settings' (flag > environment > file > default); this only records which layer
held each name, from the same inputs, to word error messages.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

ENV_PREFIX = "VLLM_SIDECAR_"
# How close a misspelt name must be to a known one to be suggested (difflib's ratio): one or two letters off
# a name of ten; far enough that unrelated names sharing the prefix (VLLM_SIDECAR_VLLM_PYTHON) suggest nothing.
SUGGEST_CUTOFF = 0.8


class Layer(IntEnum):
    """The layers in precedence order: a higher one wins, and is the one to blame in a conflict."""

    DEFAULT = 0
    FILE = 1
    ENVIRONMENT = 2
    FLAG = 3


# A setting whose command line shows a shorter flag than its name (`--timeout` for `request_timeout`, kept apart
# from the daemon's `timeout` in the environment): registered with the flags (`settings_cli.settings_flags`).
SHORT_FLAGS: dict[str, str] = {}


def flag_of(name: str) -> str:
    return SHORT_FLAGS.get(name) or "--" + name.replace("_", "-")


def environment_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True, slots=True, kw_only=True)
class Origin:
    setting: str
    layer: Layer | None  # None: not known (settings built without `load_settings`)
    where: str = ""  # the environment variable as spelt, or the config file's path

    def describe(self) -> str:
        """For the end of an error line: what to change, where."""
        if self.layer is Layer.FLAG:
            return f"flag {flag_of(self.setting)}"
        if self.layer is Layer.ENVIRONMENT:
            return f"environment {self.where}"
        if self.layer is Layer.FILE:
            return f"in {self.where}"
        both = f"flag {flag_of(self.setting)}, environment {environment_of(self.setting)}"
        return f"the default; set it with {both}" if self.layer is Layer.DEFAULT else both

    def short(self) -> str:
        """For a value quoted inside a message: '' for a flag (the flag is named already)."""
        if self.layer is Layer.ENVIRONMENT:
            return f" from environment {self.where}"
        if self.layer is Layer.FILE:
            return f" in {self.where}"
        if self.layer is Layer.DEFAULT:
            return ", the default"
        return ""


def origins(
    names: Iterable[str],
    *,
    flags: Mapping[str, object],
    environ: Mapping[str, str],
    config_file: Path | None,
    file_keys: Collection[str],
) -> dict[str, Origin]:
    """The layer each name's value comes from. Environment names match in any case, as pydantic-settings
    reads them (`case_sensitive=False`)."""
    spelt = {key.upper(): key for key in environ if key.upper().startswith(ENV_PREFIX)}
    found: dict[str, Origin] = {}
    for name in names:
        variable = spelt.get(environment_of(name))
        if name in flags:
            found[name] = Origin(setting=name, layer=Layer.FLAG)
        elif variable is not None:
            found[name] = Origin(setting=name, layer=Layer.ENVIRONMENT, where=variable)
        elif name in file_keys and config_file is not None:
            found[name] = Origin(setting=name, layer=Layer.FILE, where=str(config_file))
        else:
            found[name] = Origin(setting=name, layer=Layer.DEFAULT)
    return found


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most likely misspells, or None when none is close."""
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=SUGGEST_CUTOFF)
    return matches[0] if matches else None
