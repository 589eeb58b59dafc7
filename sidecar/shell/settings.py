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
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, overload
from urllib.parse import SplitResult, urlsplit

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sidecar.bounds import pydantic_bounds
from sidecar.config import setting_origin
from sidecar.config.accepted import accepted
from sidecar.config.address import split_listen
from sidecar.config.config_file import FileBackedSettings, config_path
from sidecar.config.config_file import SettingsError as SettingsError  # noqa: PLC0414 - re-exported, as before
from sidecar.config.config_file import read_config_file as read_config_file  # noqa: PLC0414 - re-exported
from sidecar.config.setting_origin import Origin, flag_of, origins
from sidecar.config.settings_cli import load_flags
from sidecar.derive.settings import DeriveSettings
from sidecar.exporter.rate_limit import RateLimit, parse_rate_limit
from sidecar.model.remediation import Allowance
from sidecar.policy.settings import PolicySettings
from sidecar.shell.setting_conflict import ConflictError, blame, find_conflict, shown

ENV_PREFIX = setting_origin.ENV_PREFIX
SECRET_SETTINGS = frozenset({"webhook_url"})  # never echoed in errors, logs or /status


# The help's groups, in the order `run --help` shows them.
READING = "reading vLLM and the GPUs"
DERIVING = "derived metrics"
PAUSING = "pausing admission (/readyz 503)"
RESTARTING = "restarting vLLM"
ADAPTER = "how vLLM is restarted"
TELLING = "notifications and why vLLM died"
SERVING = "the sidecar's own HTTP server"
GENERAL = "general"
GROUP_ORDER = (GENERAL, READING, DERIVING, PAUSING, RESTARTING, ADAPTER, TELLING, SERVING)


def _setting(
    default: Any,
    description: str,
    *,
    group: str,
    form: str | None = None,
    metavar: str | None = None,
    unit: str | None = None,
    note: str | None = None,
    why: str | None = None,
    core: tuple[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    """A setting: its default, one line of help and its help group. `form`: what a text setting accepts where
    no type can say it (a URL, HOST:PORT); `unit`: a number's; `note`: a rule its range cannot say; `why`: the
    longer explanation docs/settings.md gives; `core`: the pure core's field it feeds. Its type, range and
    choices are stated by the field itself (`sidecar.config.accepted` words them)."""
    stated = {"group": group, "format": form, "metavar": metavar, "unit": unit, "note": note, "why": why}
    extra: dict[str, Any] = {key: value for key, value in stated.items() if value is not None}
    if core is not None:
        extra[core[0]] = core[1]
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


# The pure core's settings hold the defaults and ranges; a setting that feeds one names its field there and takes
# both from it, so the flag, the policy, the alert rules and the dashboard cannot disagree (see `core_values`).
POLICY = PolicySettings()
DERIVE = DeriveSettings()


def _policy(field: str, description: str, **kwargs: Any) -> Any:
    """A setting that is `PolicySettings.<field>`: its default and range are the policy's."""
    bounds = pydantic_bounds(PolicySettings, field)
    return _setting(getattr(POLICY, field), description, core=("policy", field), **bounds, **kwargs)


def _derive(field: str, description: str, *, group: str = DERIVING, **kwargs: Any) -> Any:
    """A setting that is `DeriveSettings.<field>`: its default and range are the derivation's."""
    bounds = pydantic_bounds(DeriveSettings, field)
    return _setting(getattr(DERIVE, field), description, group=group, core=("derive", field), **bounds, **kwargs)


class ScrapeSettings(FileBackedSettings):
    """What reading vLLM and the GPUs takes: the settings `once` and `run` share."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True)

    config: Path | None = _setting(
        None,
        "TOML or YAML settings file",
        group=GENERAL,
        form="a file path",
        why="TOML (`.toml`) or YAML file with settings",
    )
    vllm_url: str = _setting(
        "http://127.0.0.1:8000",
        "vLLM's root URL (not /v1)",
        group=READING,
        form="an http:// or https:// URL with a host",
        metavar="URL",
        why="base URL of the vLLM OpenAI server; no `user:password@` (the URL is shown in `/status` and logs)",
    )
    interval: float = _setting(
        2.0,
        "seconds between polls",
        group=READING,
        unit="seconds",
        gt=0,
        le=3600,
        why="seconds between polls",
    )
    timeout: float | None = _setting(
        None,
        "one poll's limit (default 0.8 x --interval)",
        why="seconds one poll's requests to vLLM may take in all; unset: 80 % of the interval, at most 10",
        group=READING,
        unit="seconds",
        note="shorter than --interval",
        gt=0,
    )
    max_response_bytes: int = _setting(
        16 * 1024 * 1024,
        "largest /metrics body read",
        group=READING,
        unit="bytes",
        ge=1024,
        le=1024 * 1024 * 1024,
        why="largest `/metrics` body read from vLLM; a larger one is a problem, not a crash",
    )
    gpu_source: Literal["nvml", "sim", "none"] = _setting(
        "nvml",
        "where GPU memory is read",
        group=READING,
        why=(
            "`nvml`; `sim` to read the simulator's GPUs from `--vllm-url`/sim/gpu (only ever when asked); `none` "
            "to read no GPU"
        ),
    )
    gpus: str = _setting(
        "all",
        "GPU indices to watch",
        group=READING,
        form="'all' or a comma-separated list of indices such as 0,1",
        metavar="all|0,1,..",
        why="GPU indices to watch: `all` or a list such as `0,1`",
    )
    gpu_memory_utilization: float | None = _derive(
        "gpu_memory_utilization",
        "vLLM's, when cache_config_info lacks it",
        group=READING,
        metavar="RATIO",
        why="vLLM's `--gpu-memory-utilization`, when its `cache_config_info` does not say or engines disagree",
    )
    probe_dir: Path | None = _setting(
        None,
        "the allocator probe's folder (unset: none)",
        group=READING,
        form="a directory path",
        why=(
            "the directory where the `vllm_sidecar_probe` plugin inside vLLM writes PyTorch's allocator "
            "statistics, one file per vLLM process (the same path and variable as in vLLM's environment); unset: "
            "no allocator probe"
        ),
    )
    vllm_process_pattern: str = _setting(
        r"vllm|VLLM::",
        "vLLM's GPU processes",
        group=READING,
        form="a Python regular expression",
        metavar="REGEX",
        why=(
            "regular expression matched on a GPU process's name and command line to tell vLLM's memory from other "
            "tenants'"
        ),
    )
    log_format: Literal["auto", "json", "console"] = _setting(
        "auto",
        "JSON lines, or for a terminal",
        group=GENERAL,
        why="`json` lines, `console`, or `auto` (console on a terminal)",
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

    @field_validator("*")
    @classmethod
    def _check_finite(cls, value: object) -> object:
        # pydantic takes "inf" for a float with only a lower bound; the policy would refuse it later, unnamed.
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _check_pairs(self) -> ScrapeSettings:
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


# pydantic warns that a field named `json` shadows BaseModel.json(), a deprecated method nothing here calls; the
# option is --json (VLLM_SIDECAR_JSON), as the doctor's and the load tester's.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "json"', category=UserWarning)

    class OnceSettings(ScrapeSettings):
        """`once`: one poll, printed."""

        json: bool = _setting(False, "print the JSON document", group=GENERAL)  # type: ignore[assignment]


class Settings(ScrapeSettings):
    """`run`: the daemon's settings."""

    listen: str = _setting(
        "0.0.0.0:9468",
        "where the sidecar serves",
        group=SERVING,
        form="HOST:PORT with a port from 0 to 65535 ([::1]:PORT for IPv6)",
        metavar="HOST:PORT",
        why="`HOST:PORT` of the sidecar's own HTTP server (`[::1]:PORT` for IPv6)",
    )
    state_dir: Path = _setting(
        Path("/var/lib/vllm-sidecar"),
        "state kept across restarts",
        group=GENERAL,
        form="a directory path",
        why="state that must survive the sidecar's own restart (the restart ledger); checked at start (see above)",
    )
    dry_run: bool = _setting(
        False,
        "act on nothing, only report",
        group=GENERAL,
        why="decide and report but act on nothing: readiness stays 200, no restart, the ledger is not written",
    )
    log_level: Literal["debug", "info", "warning", "error"] = _setting(
        "info",
        "least severity logged",
        group=GENERAL,
    )
    window: float = _derive(
        "window_s",
        "window of hit ratios and rates",
        why="seconds of history for the prefix-cache hit ratio and rates",
    )
    memory_trend_window: float = _derive(
        "memory_trend_window_s",
        "window of the memory trend",
        why="seconds of history for the GPU memory growth trend",
    )
    min_trend_r2: float = _derive(
        "min_trend_r2",
        "least R² of a memory forecast",
        why="least R² of the memory trend before a time to OOM is forecast",
    )
    # --- the policy: pausing ---
    pause_kv_usage: float = _policy(
        "pause_kv_usage_ratio",
        "pause at this KV cache usage",
        group=PAUSING,
        note="above --resume-kv-usage",
        why="pause admission when an engine's KV usage reaches this",
    )
    resume_kv_usage: float = _policy(
        "resume_kv_usage_ratio",
        "resume at this KV cache usage",
        group=PAUSING,
        note="below --pause-kv-usage",
        why="resume when every engine is at or below this (and the other conditions cleared, after 10 s paused)",
    )
    min_gpu_free: float = _policy(
        "min_gpu_free_ratio",
        "pause below this free GPU share",
        group=PAUSING,
        why=(
            "pause when a GPU's free memory falls below this share of its total (unless other processes hold it "
            "with vLLM inside its budget: see [acting.md](acting.md))"
        ),
    )
    pause_alloc_retries: int = _policy(
        "pause_alloc_retries",
        "pause at N alloc retries; 0 off",
        group=PAUSING,
        why=(
            "pause admission when PyTorch's allocator in a vLLM process retried this many allocations (freed its "
            "whole cache to fit a tensor), or failed one, over the last 5 polls; resume when 5 polls pass "
            "without; needs `--probe-dir`; 0: never"
        ),
    )
    stall_pause_after: float = _policy(
        "stall_pause_after_s",
        "pause after a stall this long",
        group=PAUSING,
        note="a pause this early costs little, the restart waits for --hung-after",
        why=(
            "seconds without engine progress, with requests waiting or running, before admission pauses (until "
            "progress resumes or the restart); also how long the engine probe may wait for its answer before "
            "admission pauses"
        ),
    )
    probe_after: float = _policy(
        "probe_after_s",
        "probe an idle stall after; 0 off",
        group=PAUSING,
        why=(
            "seconds without engine progress on an engine that reads idle before the engine probe sends one "
            "1-token completion; an engine with requests and no progress is probed when its stall pauses "
            "admission (`--stall-pause-after`). A fresh vLLM that has generated no token gets a warm-up sized "
            "like a real request instead, never the short probe. `0`: no probe (an engine wedged while idle then "
            "goes unseen)"
        ),
    )
    probe_timeout: float = _policy(
        "probe_timeout_s",
        "how long a probe may wait",
        group=PAUSING,
        why=(
            "seconds the probe may wait; no answer in this time proves a wedge only when no counter moved since "
            "it was sent (a probe queued behind a busy engine proves nothing)"
        ),
    )
    vllm_api_key_file: Path | None = _setting(
        None,
        "vLLM's --api-key, for the probe",
        group=PAUSING,
        form="a path",
        why=(
            "file with vLLM's `--api-key`, sent by the probe (`/v1/models`, `/v1/completions`); without it such a"
            " vLLM answers the probe 401, which proves nothing and leaves the hung rule to the stall alone"
        ),
    )
    # --- the policy: restarting ---
    dead_after: float = _policy(
        "dead_after_s",
        "restart if /health fails this long",
        group=RESTARTING,
        why="seconds `/health` may fail, after it was healthy, before vLLM is restarted",
    )
    down_after: float = _policy(
        "down_after_s",
        "restart if down, supervised",
        group=RESTARTING,
        note="longer than vLLM takes to load if a supervisor restarts it",
        why=(
            "seconds nothing may listen at vLLM's address while a supervisor may be bringing it back (systemd's "
            "auto-restart or a queued start, the kubelet) before the sidecar restarts it"
        ),
    )
    down_unsupervised_after: float = _policy(
        "down_unsupervised_after_s",
        "restart if down, unsupervised",
        group=RESTARTING,
        why=(
            "seconds nothing may listen at vLLM's address when nobody else will start it before the sidecar "
            "restarts it: always with `--actuator exec`; under systemd when the unit is stopped with no job "
            "queued (vLLM exited 0 after its engine died, under `Restart=on-failure`)"
        ),
    )
    hung_after: float = _policy(
        "hung_after_s",
        "restart a stall, probe unanswered",
        group=RESTARTING,
        why=(
            "seconds without engine progress before vLLM is restarted, once the engine probe sent meanwhile got "
            "no answer with no counter moving (idle-looking or not): the longest pause of a live engine that is "
            "never restarted"
        ),
    )
    hung_without_probe_after: float = _policy(
        "hung_without_probe_after_s",
        "restart a stall, no probe",
        group=RESTARTING,
        why=(
            "where no probe can tell (`--probe-after 0`, or the probe's requests fail): seconds without progress,"
            " with requests waiting or running, before vLLM is restarted"
        ),
    )
    oom_forecast: float = _policy(
        "oom_forecast_s",
        "restart at this time to OOM",
        why="planned restart when the forecast time to OOM stays under this for 3 polls",
        group=RESTARTING,
    )
    forecast_min_uptime: float = _policy(
        "min_uptime_for_forecast_restart_s",
        "least uptime for a forecast restart",
        group=RESTARTING,
        why="seconds vLLM must have been up before a forecast-driven restart",
    )
    pressure_restarts: bool = _policy(
        "pressure_events_restart",
        f"restart on {POLICY.pressure_events} pauses in {POLICY.pressure_window_s / 60:g} min",
        group=RESTARTING,
        why="also restart after 3 pauses in 5 minutes (off: under pure load a restart only loses capacity)",
    )
    max_restarts_per_hour: int = _policy(
        "max_restarts_per_hour",
        "automatic restarts per hour",
        group=RESTARTING,
        note="0: none",
        why="automatic restarts allowed in any hour (0: none)",
    )
    drain_timeout: float = _policy(
        "drain_timeout_s",
        "wait for requests to finish",
        group=RESTARTING,
        why="seconds to wait for running requests to finish before restarting anyway",
    )
    startup_timeout: float = _policy(
        "startup_timeout_s",
        "wait this long for vLLM to start",
        group=RESTARTING,
        why="seconds to wait for vLLM to be healthy after a restart",
    )
    remediate: str | None = _setting(
        None,
        "flags it may change, with ranges (off)",
        group=RESTARTING,
        form="FLAG=LOW..HIGH[,...] of max-model-len, max-num-seqs, max-num-batched-tokens, gpu-memory-utilization",
        metavar="LIST",
        why=(
            "opt-in remediation (see [remediation.md](remediation.md)): after a crash whose cause the doctor "
            "determined, set the flag it computed for vLLM's next start, within the range given here, in "
            "`<state-dir>/vllm-flags.env` (on Kubernetes: vLLM's args in its Deployment); "
            "e.g. `max-model-len=1024..32768,gpu-memory-utilization=0.8..0.95`"
        ),
    )
    remediate_max_per_day: int = _setting(
        3,
        "flag changes in any 24 h",
        group=RESTARTING,
        ge=1,
        le=100,
        why="changes `--remediate` may make in any 24 hours; past them a fix is refused and notified",
    )
    remediate_window: float = _setting(
        1800.0,
        "a change must hold this long",
        group=RESTARTING,
        unit="seconds",
        ge=10,
        le=7 * 86400,
        why=(
            "seconds vLLM must stay healthy after a change before it is confirmed; the same cause back sooner, "
            "or vLLM not healthy within `--startup-timeout`, reverts it"
        ),
    )
    # --- the adapter ---
    actuator: Literal["none", "systemd", "kubernetes", "exec"] = _setting(
        "none",
        "how vLLM is restarted",
        group=ADAPTER,
        why="how vLLM is restarted: `systemd`, `kubernetes`, `exec`, or `none` (observe and pause only)",
    )
    systemd_unit: str = _setting(
        "vllm.service",
        "the vLLM unit (systemd)",
        group=ADAPTER,
        form="a unit name",
        metavar="UNIT",
        why="the unit the systemd adapter restarts (validated: no input can reach another unit)",
    )
    systemd_bus: Literal["system", "user"] = _setting(
        "system",
        "the systemd manager's bus",
        group=ADAPTER,
        why="`system`, or `user` for a user manager",
    )
    kubernetes_mode: Literal["evict", "delete", "rollout"] = _setting(
        "evict",
        "how the pod is restarted",
        why=(
            "`evict` (a policy/v1 Eviction: honours PodDisruptionBudgets), `delete`, or `rollout` (the owning "
            "Deployment's `restartedAt`)"
        ),
        group=ADAPTER,
    )
    kubeconfig: Path | None = _setting(
        None,
        "kubeconfig (default: service account)",
        group=ADAPTER,
        form="a path",
        why=(
            "kubeconfig file, else the pod's service account; any user kubectl 1.26+ accepts (token, `tokenFile`,"
            " client certificate, an exec plugin such as `aws eks get-token`, `gke-gcloud-auth-plugin` or "
            "`kubelogin`, the `oidc` auth-provider, impersonation with `as`): "
            "[kubernetes-credentials.md](kubernetes-credentials.md)"
        ),
    )
    pod_name: str | None = _setting(
        None,
        "this pod's name (default: POD_NAME)",
        group=ADAPTER,
        form="a pod name",
        metavar="NAME",
        why="this pod's name (the downward API's `POD_NAME` when unset)",
    )
    pod_namespace: str | None = _setting(
        None,
        "this pod's namespace (default: POD_NAMESPACE)",
        group=ADAPTER,
        form="a namespace",
        metavar="NAME",
        why="this pod's namespace (else the service account's)",
    )
    vllm_container: str = _setting(
        "vllm",
        "vLLM's container in this pod",
        group=ADAPTER,
        form="a container name (a DNS label)",
        metavar="NAME",
        why=(
            "the name of vLLM's container in this pod, whose log is read and whose state says whether the kubelet"
            " restarts it (a DNS label)"
        ),
    )
    exec_command: str | None = _setting(
        None,
        "restarts vLLM (exec); not run by a shell",
        why="the command of the exec adapter, e.g. `docker restart vllm`; split into arguments, never given to a shell",
        group=ADAPTER,
        form="a command line, e.g. 'docker restart vllm'",
        metavar="COMMAND",
    )
    # --- who is told ---
    webhook_url: str | None = _setting(
        None,
        "where notifications are POSTed",
        why="where notifications are POSTed; never logged or shown",
        group=TELLING,
        form="an http(s) URL",
        metavar="URL",
        repr=False,  # so a settings object printed in a traceback or a debugger does not show it either
    )
    webhook_format: Literal["json", "slack"] = _setting(
        "json",
        "notification body",
        group=TELLING,
        why="`json`, or `slack` (an incoming-webhook `text`)",
    )
    webhook_hmac_key_file: Path | None = _setting(
        None,
        "key file that signs notifications",
        group=TELLING,
        form="a path",
        why="key to sign notifications with (`X-Vllm-Sidecar-Signature: sha256=...` over `timestamp.body`)",
    )
    kubernetes_events: bool = _setting(
        False,
        "also post Kubernetes Events",
        group=TELLING,
        why="report pauses, resumes and restarts as Events on this pod",
    )
    vllm_log: Path | None = _setting(
        None,
        "vLLM's log, read for why it died",
        group=TELLING,
        form="a file path",
        why=(
            "vLLM's log file, whose last 256 KiB say why vLLM died (see [acting.md](acting.md), \"Restarts that "
            'say why"); with `--actuator exec` or `none` the only source, with `systemd` or `kubernetes` it '
            "replaces the journal or the pod's log"
        ),
    )
    incidents_keep: int = _setting(
        10,
        "incident folders kept (0: none)",
        group=TELLING,
        ge=0,
        le=1000,
        why=(
            "how many incident folders `<state-dir>/incidents/` keeps, the newest (see [incidents.md](incidents.md)); "
            "`0` takes none. Written only when the sidecar acts (not in dry-run, nor with `--actuator none`)"
        ),
    )
    incident_timeout: float = _setting(
        5.0,
        "longest an incident holds a restart back",
        group=TELLING,
        unit="seconds",
        ge=0.5,
        le=60,
        why=(
            "seconds an incident may take in all before a restart (vLLM's stacks, its log, writing the folder); "
            "what is not in by then is listed as not captured and the restart goes on"
        ),
    )
    incident_max_bytes: int = _setting(
        1024 * 1024,
        "largest incident folder",
        group=TELLING,
        unit="bytes",
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        why=(
            "bytes one incident folder may hold; the stacks come first, then the log's newest lines, the /status "
            "history and the metrics. `--incidents-keep` x this is the most the incidents take on disk"
        ),
    )
    # --- the sidecar's own server ---
    admin_token_file: Path | None = _setting(
        None,
        "token of POST /admin/* (unset: off)",
        group=SERVING,
        form="a path",
        why="bearer token (16+ characters) of `POST /admin/*`; without it the admin API is off",
    )
    admin_rate_limit: str = _setting(
        "10/min",
        "admin requests per client",
        why=(
            "requests to `/admin/*` per client address (IPv6: per /64), refused or not; all clients together 4 "
            "times this; `REQUESTS/PERIOD` such as `10/min`, `5/s`, `100/h`, `20/30s`; over it: 429 with "
            "`Retry-After`"
        ),
        group=SERVING,
        form="REQUESTS/PERIOD such as 10/min, 5/s, 100/h or 20/30s; 1 to 10000 per 1 s to 24 h",
        metavar="N/PERIOD",
    )
    tls_cert_file: Path | None = _setting(
        None,
        "PEM certificate chain: serve HTTPS",
        why=(
            "PEM certificate chain: serve HTTPS (TLS 1.2+) instead of HTTP; re-read when it changes; with "
            "`--tls-key-file`"
        ),
        group=SERVING,
        form="a path, together with --tls-key-file",
    )
    tls_key_file: Path | None = _setting(
        None,
        "its unencrypted PEM key",
        group=SERVING,
        form="a path, together with --tls-cert-file",
        why="the unencrypted PEM private key of `--tls-cert-file`",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_listen(value)
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

    @field_validator("remediate")
    @classmethod
    def _check_remediate(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from sidecar.policy.remediation import parse_allowances  # noqa: PLC0415 - only needed to validate

        parse_allowances(value)
        return value.strip()

    @property
    def remediation_allowances(self) -> tuple[Allowance, ...]:
        from sidecar.policy.remediation import parse_allowances  # noqa: PLC0415

        return parse_allowances(self.remediate) if self.remediate else ()

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

    @property
    def listen_address(self) -> tuple[str, int]:
        return split_listen(self.listen)

    @property
    def admin_rate(self) -> RateLimit:
        return parse_rate_limit(self.admin_rate_limit)


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


SettingsT = TypeVar("SettingsT", bound=ScrapeSettings)


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
