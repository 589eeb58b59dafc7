"""Settings from flags, `VLLM_SIDECAR_*` environment, a TOML/YAML file and defaults, in that precedence.

One model per concern, each in its own module: `reading` (what every command reads vLLM and the GPUs with),
`derive`, `policy`, `acting`, `notify` and `exporter`; `run` composes them into the daemon's `Settings`. Each
setting states its default, range and help once, in its field; a setting that feeds the pure core's
`PolicySettings` or `DeriveSettings` takes its default and range from there (`declare`). The flags, the
environment and the config file name each setting alone (the documented contract), so the composed model is flat.

A bad value is reported as one line naming the setting, what it accepts and where the value came from (the
flag, the environment variable or the config file: the one the user wrote, also when a rule between two
settings breaks), as a `SettingsError`, so the CLI can stop with exit code 2 before anything starts (`loading`).
A misspelt key in the config file gets the closest known one suggested.
"""

from sidecar.config.config_file import SettingsError, read_config_file
from sidecar.shell.settings.declare import GROUP_ORDER
from sidecar.shell.settings.loading import SECRET_SETTINGS, core_values, load_settings, setting_error
from sidecar.shell.settings.reading import ENV_PREFIX, OnceSettings, ScrapeSettings, parse_gpu_indices
from sidecar.shell.settings.run import Settings

__all__ = [
    "ENV_PREFIX",
    "GROUP_ORDER",
    "SECRET_SETTINGS",
    "OnceSettings",
    "ScrapeSettings",
    "Settings",
    "SettingsError",
    "core_values",
    "load_settings",
    "parse_gpu_indices",
    "read_config_file",
    "setting_error",
]
