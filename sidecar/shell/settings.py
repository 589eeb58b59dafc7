"""Settings from flags, `VLLM_SIDECAR_*` environment, a TOML/YAML file and defaults, in that precedence.

Reads the environment and the config file. A bad value is reported as one line naming the setting, what it
accepts and where the value came from (the flag, the environment variable or the config file: the one the user
wrote, also when a rule between two settings breaks), as a `SettingsError`, so the CLI can stop with exit
code 2 before anything starts. A misspelt key in the config file gets the closest known one suggested.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sidecar.config import setting_origin
from sidecar.config.address import split_listen
from sidecar.config.config_file import FileBackedSettings, config_path
from sidecar.config.config_file import SettingsError as SettingsError  # noqa: PLC0414 - re-exported, as before
from sidecar.config.config_file import read_config_file as read_config_file  # noqa: PLC0414 - re-exported
from sidecar.config.setting_origin import Origin, flag_of, origins
from sidecar.config.settings_cli import BOOLEAN_FORMS, load_flags
from sidecar.derive.settings import DeriveSettings
from sidecar.exporter.rate_limit import RateLimit, parse_rate_limit
from sidecar.policy.settings import PolicySettings
from sidecar.shell.setting_conflict import ConflictError, blame, find_conflict, shown

ENV_PREFIX = setting_origin.ENV_PREFIX
SECRET_SETTINGS = frozenset({"webhook_url"})  # never echoed in errors, logs or /status


def _allowed(text: str) -> dict[str, Any]:
    return {"allowed": text}


# The pure core's settings hold the defaults; a setting that feeds one names its field there and takes its default
# from it, so the flag, the policy, the alert rules and the dashboard cannot disagree (see `core_values`).
POLICY = PolicySettings()
DERIVE = DeriveSettings()


def _policy(field: str, *, allowed: str, **kwargs: Any) -> Any:
    """A setting that is `PolicySettings.<field>`: its default is the policy's."""
    return Field(getattr(POLICY, field), json_schema_extra={"allowed": allowed, "policy": field}, **kwargs)


def _derive(field: str, *, allowed: str, **kwargs: Any) -> Any:
    """A setting that is `DeriveSettings.<field>`: its default is the derivation's."""
    return Field(getattr(DERIVE, field), json_schema_extra={"allowed": allowed, "derive": field}, **kwargs)


class Settings(FileBackedSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True)

    config: Path | None = Field(
        None, description="TOML or YAML file with settings", json_schema_extra=_allowed("a file path")
    )
    vllm_url: str = Field(
        "http://127.0.0.1:8000",
        description="base URL of the vLLM OpenAI server",
        json_schema_extra=_allowed("an http:// or https:// URL with a host"),
    )
    listen: str = Field(
        "0.0.0.0:9468",
        description="address of the sidecar's own HTTP server",
        json_schema_extra=_allowed("HOST:PORT with a port from 0 to 65535 ([::1]:PORT for IPv6)"),
    )
    interval: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="seconds between polls",
        json_schema_extra=_allowed("seconds, > 0 and <= 3600"),
    )
    timeout: float | None = Field(
        None,
        gt=0,
        description="seconds one poll of vLLM may take (default: 80 % of the interval, at most 10 s)",
        json_schema_extra=_allowed("seconds, > 0 and shorter than the interval"),
    )
    max_response_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="largest /metrics body read from vLLM",
        json_schema_extra=_allowed("bytes, 1024 to 1073741824"),
    )
    window: float = _derive(
        "window_s",
        gt=0,
        le=86400,
        description="seconds of history for the prefix-cache hit ratio and rates",
        allowed="seconds, > 0 and <= 86400",
    )
    memory_trend_window: float = _derive(
        "memory_trend_window_s",
        gt=0,
        le=86400,
        description="seconds of history for the GPU memory growth trend",
        allowed="seconds, > 0 and <= 86400",
    )
    min_trend_r2: float = _derive(
        "min_trend_r2",
        ge=0,
        le=1,
        description="least R² of the memory trend before time to OOM is forecast",
        allowed="a number from 0 to 1",
    )
    gpu_source: Literal["nvml", "sim", "none"] = Field(
        "nvml",
        description="where GPU memory is read from: NVML, the simulator's /sim/gpu at --vllm-url, or nothing",
        json_schema_extra=_allowed("nvml, sim or none"),
    )
    gpus: str = Field(
        "all",
        description="GPU indices to watch",
        json_schema_extra=_allowed("'all' or a comma-separated list of indices such as 0,1"),
    )
    gpu_memory_utilization: float | None = _derive(
        "gpu_memory_utilization",
        gt=0,
        le=1,
        description="vLLM's --gpu-memory-utilization, when its cache_config_info does not say",
        allowed="a number > 0 and <= 1",
    )
    probe_dir: Path | None = Field(
        None,
        description=(
            "the directory where the vllm_sidecar_probe plugin inside vLLM writes PyTorch's allocator statistics "
            "(the same path as VLLM_SIDECAR_PROBE_DIR in vLLM's environment); unset: no allocator probe"
        ),
        json_schema_extra=_allowed("a directory path"),
    )
    vllm_process_pattern: str = Field(
        r"vllm|VLLM::",
        description="regular expression that marks a GPU process as vLLM's (matched on its name and command line)",
        json_schema_extra=_allowed("a Python regular expression"),
    )
    state_dir: Path = Field(
        Path("/var/lib/vllm-sidecar"),
        description="where the sidecar keeps state that must survive its own restart",
        json_schema_extra=_allowed("a directory path"),
    )
    dry_run: bool = Field(
        False,
        description="decide and report, but act on nothing",
        json_schema_extra=_allowed("true or false"),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="least severity logged",
        json_schema_extra=_allowed("debug, info, warning or error"),
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto",
        description="log rendering: JSON lines, or console on a terminal",
        json_schema_extra=_allowed("auto, json or console"),
    )

    # --- acting: the policy's main thresholds (the others keep the defaults documented in docs/settings.md) ---
    pause_kv_usage: float = _policy(
        "pause_kv_usage_ratio",
        gt=0,
        le=1,
        description="pause admission when an engine's KV usage reaches this",
        allowed="a ratio > 0 and <= 1, above --resume-kv-usage",
    )
    resume_kv_usage: float = _policy(
        "resume_kv_usage_ratio",
        gt=0,
        le=1,
        description="resume admission only when every engine is at or below this",
        allowed="a ratio > 0 and <= 1, below --pause-kv-usage",
    )
    min_gpu_free: float = _policy(
        "min_gpu_free_ratio",
        gt=0,
        le=1,
        description="pause admission when a GPU's free memory falls below this share",
        allowed="a ratio > 0 and <= 1",
    )
    pause_alloc_retries: int = _policy(
        "pause_alloc_retries",
        ge=0,
        description=(
            "pause admission when PyTorch's allocator in vLLM retried this many allocations (or failed one) over "
            f"the last {DERIVE.short_horizon_polls} polls (needs --probe-dir); 0: never"
        ),
        allowed="a whole number >= 0",
    )
    dead_after: float = _policy(
        "dead_after_s",
        gt=0,
        description="seconds /health may fail, after it was healthy, before vLLM is restarted",
        allowed="seconds > 0",
    )
    down_after: float = _policy(
        "down_after_s",
        gt=0,
        description=(
            "seconds nothing may listen at vLLM's address while a supervisor may be bringing it back (systemd's "
            "auto-restart, the kubelet) before a restart"
        ),
        allowed="seconds > 0; longer than vLLM takes to load if a supervisor restarts it",
    )
    down_unsupervised_after: float = _policy(
        "down_unsupervised_after_s",
        gt=0,
        description=(
            "seconds nothing may listen at vLLM's address when nobody else will start it (--actuator exec; a "
            "systemd unit stopped with no job queued) before the sidecar restarts it"
        ),
        allowed="seconds > 0",
    )
    hung_after: float = _policy(
        "hung_after_s",
        gt=0,
        description=(
            "seconds without engine progress before a restart, once a probe sent meanwhile got no answer with "
            "nothing moving: the longest pause of a live engine that is never restarted"
        ),
        allowed="seconds > 0",
    )
    hung_without_probe_after: float = _policy(
        "hung_without_probe_after_s",
        gt=0,
        description=(
            "seconds without engine progress, with requests waiting or running, before a restart where no probe "
            "can tell (--probe-after 0, or the probe's requests fail)"
        ),
        allowed="seconds > 0",
    )
    stall_pause_after: float = _policy(
        "stall_pause_after_s",
        gt=0,
        description="seconds without engine progress, with requests waiting or running, before admission pauses",
        allowed="seconds > 0; a pause this early costs little, the restart waits for --hung-after",
    )
    probe_after: float = _policy(
        "probe_after_s",
        ge=0,
        description=(
            "seconds without engine progress on an engine that reads idle before one 1-token completion probes "
            "it for a wedge (a stall with requests is probed at --stall-pause-after); 0: never (an engine wedged "
            "while idle then goes unseen)"
        ),
        allowed="seconds >= 0",
    )
    probe_timeout: float = _policy(
        "probe_timeout_s",
        gt=0,
        description=(
            "seconds the probe may wait; no answer in this time proves a wedge only if no counter moved meanwhile "
            "(a probe queued behind a busy engine proves nothing)"
        ),
        allowed="seconds > 0",
    )
    vllm_api_key_file: Path | None = Field(
        None,
        description="file with vLLM's --api-key, for the probe's requests to /v1 (never logged)",
        json_schema_extra=_allowed("a path"),
    )
    oom_forecast: float = _policy(
        "oom_forecast_s",
        gt=0,
        description=(
            f"restart in a planned way when the time to OOM stays under this ({POLICY.oom_forecast_ticks} polls)"
        ),
        allowed="seconds > 0",
    )
    forecast_min_uptime: float = _policy(
        "min_uptime_for_forecast_restart_s",
        ge=0,
        description="seconds vLLM must have been up before a forecast-driven restart (a young trend is noise)",
        allowed="seconds >= 0",
    )
    max_restarts_per_hour: int = _policy(
        "max_restarts_per_hour",
        ge=0,
        le=60,
        description="automatic restarts allowed in any hour (0: none)",
        allowed="0 to 60",
    )
    drain_timeout: float = _policy(
        "drain_timeout_s",
        gt=0,
        description="seconds to wait for running requests to finish before restarting anyway",
        allowed="seconds > 0",
    )
    startup_timeout: float = _policy(
        "startup_timeout_s",
        gt=0,
        description="seconds to wait for vLLM to be healthy after a restart",
        allowed="seconds > 0",
    )
    pressure_restarts: bool = _policy(
        "pressure_events_restart",
        description=(
            f"also restart after {POLICY.pressure_events} pauses in {POLICY.pressure_window_s / 60:g} minutes "
            "(off: under pure load it loses capacity)"
        ),
        allowed="true or false",
    )
    # --- acting: how vLLM is restarted, who is told, who may override ---
    actuator: Literal["none", "systemd", "kubernetes", "exec"] = Field(
        "none", description="how vLLM is restarted", json_schema_extra=_allowed("none, systemd, kubernetes or exec")
    )
    systemd_unit: str = Field(
        "vllm.service", description="the vLLM unit (systemd adapter)", json_schema_extra=_allowed("a unit name")
    )
    systemd_bus: Literal["system", "user"] = Field(
        "system", description="which bus the systemd manager is on", json_schema_extra=_allowed("system or user")
    )
    kubernetes_mode: Literal["evict", "delete", "rollout"] = Field(
        "evict",
        description="how the Kubernetes adapter restarts the pod",
        json_schema_extra=_allowed("evict (honours PodDisruptionBudgets), delete or rollout"),
    )
    kubeconfig: Path | None = Field(
        None, description="kubeconfig file (default: in-cluster service account)", json_schema_extra=_allowed("a path")
    )
    pod_name: str | None = Field(
        None,
        description="this pod's name (default: POD_NAME from the downward API)",
        json_schema_extra=_allowed("a pod name"),
    )
    pod_namespace: str | None = Field(
        None,
        description="this pod's namespace (default: POD_NAMESPACE, then the service account's)",
        json_schema_extra=_allowed("a namespace"),
    )
    kubernetes_events: bool = Field(
        False,
        description="also report pauses, resumes and restarts as Kubernetes Events on this pod",
        json_schema_extra=_allowed("true or false"),
    )
    exec_command: str | None = Field(
        None,
        description="command that restarts vLLM (exec adapter); split like a shell would, never run by one",
        json_schema_extra=_allowed("a command line, e.g. 'docker restart vllm'"),
    )
    webhook_url: str | None = Field(
        None,
        description="where notifications are POSTed (never logged)",
        json_schema_extra=_allowed("an http(s) URL"),
        repr=False,  # so a settings object printed in a traceback or a debugger does not show it either
    )
    webhook_format: Literal["json", "slack"] = Field(
        "json", description="notification body", json_schema_extra=_allowed("json or slack")
    )
    webhook_hmac_key_file: Path | None = Field(
        None,
        description="file with a key to sign notifications (X-Vllm-Sidecar-Signature)",
        json_schema_extra=_allowed("a path"),
    )
    admin_token_file: Path | None = Field(
        None,
        description="file with the bearer token of POST /admin/* (no file: the admin API is off)",
        json_schema_extra=_allowed("a path"),
    )
    admin_rate_limit: str = Field(
        "10/min",
        description=(
            "requests to /admin/* allowed per client address, refused or not (all clients together: 4 times this)"
        ),
        json_schema_extra=_allowed("REQUESTS/PERIOD such as 10/min, 5/s, 100/h or 20/30s; 1 to 10000 per 1 s to 24 h"),
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate chain of the sidecar's own listener (HTTPS); re-read when it changes",
        json_schema_extra=_allowed("a path, together with --tls-key-file"),
    )
    tls_key_file: Path | None = Field(
        None,
        description="unencrypted PEM private key of --tls-cert-file",
        json_schema_extra=_allowed("a path, together with --tls-cert-file"),
    )
    # --- acting: why vLLM died, read from its own log for the restart notifications and /status ---
    vllm_log: Path | None = Field(
        None,
        description=(
            "vLLM's log file, whose last 256 KiB say why it died (default: the unit's journal with --actuator "
            "systemd, the container's log with Kubernetes; this file instead when set)"
        ),
        json_schema_extra=_allowed("a file path"),
    )
    vllm_container: str = Field(
        "vllm",
        description=(
            "the name of vLLM's container in this pod, whose log is read and whose state says whether the kubelet "
            "restarts it (Kubernetes)"
        ),
        json_schema_extra=_allowed("a container name (a DNS label)"),
    )

    @field_validator("vllm_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        _check_url_characters(value)
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL with a host")
        if parts.username is not None or parts.password is not None:
            # vLLM asks no credentials for /metrics, /health or /version, and this URL is shown in /status,
            # `once` and the logs: a password in it would be published.
            raise ValueError("credentials in the URL are not accepted (the URL is shown in /status and logs)")
        try:
            _ = parts.port
        except ValueError:
            raise ValueError("invalid port") from None
        _check_url_root(parts)
        return value.rstrip("/")

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_listen(value)
        return value

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, value: str) -> str:
        parse_gpu_indices(value)
        return value.strip()

    @field_validator("vllm_process_pattern")
    @classmethod
    def _check_pattern(cls, value: str) -> str:
        import re  # noqa: PLC0415 - only needed to validate

        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from None
        return value

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value is not None:
            _check_url_characters(value)
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("not an http(s) URL with a host")  # the URL itself is not repeated: a secret
        return value

    @field_validator("admin_rate_limit")
    @classmethod
    def _check_rate_limit(cls, value: str) -> str:
        parse_rate_limit(value)
        return value.strip()

    @field_validator("vllm_container")
    @classmethod
    def _check_container(cls, value: str) -> str:
        from sidecar.actuators.kube_names import check_label  # noqa: PLC0415 - only needed to validate

        return check_label(value, what="container name")

    @field_validator("exec_command")
    @classmethod
    def _check_exec(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                argv = shlex.split(value)
            except ValueError as error:
                raise ValueError(f"cannot be split into arguments: {error}") from None
            if not argv:
                raise ValueError("is empty")
        return value

    @field_validator("*")
    @classmethod
    def _check_finite(cls, value: object) -> object:
        # pydantic takes "inf" for a float with only a lower bound; the policy would refuse it later, unnamed.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _check_pairs(self) -> Settings:
        # A rule between two settings: `load_settings` words the error against whichever the user gave.
        conflict = find_conflict(dict(self))
        if conflict is not None:
            raise conflict
        return self

    # Where each value came from, for errors found after loading (an unusable --state-dir); set by load_settings.
    _origins: dict[str, Origin] = PrivateAttr(default_factory=dict)

    def origin(self, name: str) -> Origin:
        return self._origins.get(name) or Origin(setting=name, layer=None)

    @property
    def poll_timeout_s(self) -> float:
        return self.timeout if self.timeout is not None else min(0.8 * self.interval, 10.0)

    @property
    def gpu_indices(self) -> tuple[int, ...] | None:
        return parse_gpu_indices(self.gpus)

    @property
    def listen_address(self) -> tuple[str, int]:
        return split_listen(self.listen)

    @property
    def admin_rate(self) -> RateLimit:
        return parse_rate_limit(self.admin_rate_limit)


def core_values(settings: Settings, core: Literal["policy", "derive"]) -> dict[str, Any]:
    """The values of the settings that feed `PolicySettings` or `DeriveSettings`, by the core's field names:
    the mapping is the one each setting declares (`_policy`, `_derive`), so no second list can fall behind."""
    values: dict[str, Any] = {}
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        target = extra.get(core)
        if isinstance(target, str):
            values[target] = getattr(settings, name)
    return values


# What follows /v1 in the OpenAI API's paths, so /v1/chat/completions is caught but a proxy's /api/v1/... is not.
_OPENAI_ROUTES = frozenset({"chat", "completions", "models", "embeddings", "responses", "audio", "tokenize"})


def _check_url_root(parts: SplitResult) -> None:
    """The server's root, not an API path: the sidecar reads vLLM's /metrics, /health and /version at its root,
    and http://host:8000/v1 (the OpenAI API's base URL, which clients are given) is the usual mistake."""
    segments = parts.path.rstrip("/").split("/")
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        openai = segment == "v1" and (last or segments[index + 1] in _OPENAI_ROUTES)
        if openai or (last and segment in ("metrics", "health", "version")):
            root = parts._replace(path="/".join(segments[:index]), query="", fragment="").geturl()
            raise ValueError(
                f"ends in /{'/'.join(segments[index:])}, but the sidecar reads /metrics, /health and /version "
                f"at the server's root: drop /{segment}{'' if last else '/...'} and give {root}"
            )


def _check_url_characters(url: str) -> None:
    # urlsplit() drops tabs and line breaks without a word (so "http://vllm\n:8000" passes the checks) while
    # httpx refuses them: such a URL would load, then fail every poll.
    if any(char.isspace() or not char.isprintable() for char in url):
        raise ValueError("contains whitespace or a control character")


def parse_gpu_indices(value: str) -> tuple[int, ...] | None:
    text = value.strip().lower()
    if text == "all":
        return None
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError("neither 'all' nor a list of GPU indices") from None
    if any(index < 0 for index in indices) or len(set(indices)) != len(indices):
        raise ValueError("GPU indices must be distinct and non-negative")
    return indices


def load_settings(flags: Mapping[str, Any]) -> Settings:
    """Build settings from the flags (pydantic-settings' CLI on the command's parser collected them), the
    environment and the config file; raise `SettingsError` with one line naming the first bad setting and
    where it was set."""
    names = set(Settings.model_fields)
    path = config_path(flags, os.environ)
    file_keys = read_config_file(path, names) if path is not None else {}
    found = origins(names, flags=flags, environ=os.environ, config_file=path, file_keys=set(file_keys))
    try:
        settings = load_flags(Settings, flags)
    except ValidationError as error:
        raise SettingsError(_describe(error, found)) from None
    settings._origins = found  # the model's own private attribute, set once, by its factory
    return settings


def setting_error(settings: Settings, name: str, why: str, *, allowed: bool = True) -> SettingsError:
    """An error about a setting found after loading (a directory that cannot be written), in the same words.
    `allowed=False` leaves out what the setting accepts: for a value of the right form that the machine refuses
    (a systemd unit it does not know), where `why` already says what to do."""
    given = "" if name in SECRET_SETTINGS else f"={shown(getattr(settings, name))!r}"
    return SettingsError(_line(name, given, why, settings.origin(name), allowed=allowed))


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


def _describe(error: ValidationError, found: Mapping[str, Origin]) -> str:
    first = error.errors()[0]
    conflict = first.get("ctx", {}).get("error")
    if isinstance(conflict, ConflictError):
        blamed = blame(conflict, found)
        name, message = blamed.setting, blamed.message
        given = "" if name in SECRET_SETTINGS or blamed.value is None else f"={shown(blamed.value)!r}"
    else:
        name = str(first["loc"][0]) if first["loc"] else "settings"
        shown_input = name in Settings.model_fields and name not in SECRET_SETTINGS
        given = (
            f"={_without_userinfo(first['input'])!r}" if shown_input and not isinstance(first["input"], dict) else ""
        )
        message = str(first["msg"]).removeprefix("Value error, ")
    return _line(name, given, message, found.get(name) or Origin(setting=name, layer=None))


def _line(name: str, given: str, message: str, origin: Origin, *, allowed: bool = True) -> str:
    field = Settings.model_fields.get(name)
    extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
    accepted = f"; allowed: {extra['allowed']}" if "allowed" in extra and allowed else ""
    if field is not None and field.annotation is bool and allowed:  # the forms pydantic reads, the help shows too
        accepted = f"; allowed: {BOOLEAN_FORMS} (a bare {flag_of(name)} means true)"
    return f"invalid setting {name}{given}: {message}{accepted} ({origin.describe()})"
