"""What reading vLLM and the GPUs takes: the settings `once` and `run` share, and `once`'s own. No I/O."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import PrivateAttr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sidecar.config import setting_origin
from sidecar.config.config_file import FileBackedSettings
from sidecar.config.setting_origin import Origin
from sidecar.shell.setting_conflict import find_conflict
from sidecar.shell.settings.declare import GENERAL, READING, derive_setting, setting

ENV_PREFIX = setting_origin.ENV_PREFIX


class ScrapeSettings(FileBackedSettings):
    """What reading vLLM and the GPUs takes: the settings `once` and `run` share."""

    section: ClassVar[str] = "reading"  # its table in a config file
    top_level: ClassVar[frozenset[str]] = frozenset({"config", "log_format"})  # the whole file's, in no table

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True)

    config: Path | None = setting(
        None,
        "TOML or YAML settings file",
        group=GENERAL,
        form="a file path",
        why="TOML (`.toml`) or YAML file with settings",
    )
    vllm_url: str = setting(
        "http://127.0.0.1:8000",
        "vLLM's root URL (not /v1)",
        group=READING,
        form="an http:// or https:// URL with a host",
        metavar="URL",
        why="base URL of the vLLM OpenAI server; no `user:password@` (the URL is shown in `/status` and logs)",
    )
    interval: float = setting(
        2.0,
        "seconds between polls",
        group=READING,
        unit="seconds",
        gt=0,
        le=3600,
        why="seconds between polls",
    )
    timeout: float | None = setting(
        None,
        "one poll's limit (default 0.8 x --interval)",
        why="seconds one poll's requests to vLLM may take in all; unset: 80 % of the interval, at most 10",
        group=READING,
        unit="seconds",
        note="shorter than --interval",
        gt=0,
    )
    max_response_bytes: int = setting(
        16 * 1024 * 1024,
        "largest /metrics body read",
        group=READING,
        unit="bytes",
        ge=1024,
        le=1024 * 1024 * 1024,
        why="largest `/metrics` body read from vLLM; a larger one is a problem, not a crash",
    )
    gpu_source: Literal["nvml", "sim", "none"] = setting(
        "nvml",
        "where GPU memory is read",
        group=READING,
        why=(
            "`nvml`; `sim` to read the simulator's GPUs from `--vllm-url`/sim/gpu (only ever when asked); `none` "
            "to read no GPU"
        ),
    )
    gpus: str = setting(
        "all",
        "GPU indices to watch",
        group=READING,
        form="'all' or a comma-separated list of indices such as 0,1",
        metavar="all|0,1,..",
        why="GPU indices to watch: `all` or a list such as `0,1`",
    )
    gpu_memory_utilization: float | None = derive_setting(
        "gpu_memory_utilization",
        "vLLM's, when cache_config_info lacks it",
        group=READING,
        metavar="RATIO",
        why="vLLM's `--gpu-memory-utilization`, when its `cache_config_info` does not say or engines disagree",
    )
    probe_dir: Path | None = setting(
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
    vllm_process_pattern: str = setting(
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
    log_format: Literal["auto", "json", "console"] = setting(
        "auto",
        "JSON lines, or for a terminal",
        group=GENERAL,
        why="`json` lines, `console`, or `auto` (console on a terminal)",
    )

    @field_validator("vllm_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        check_url_characters(value)
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

        json: bool = setting(False, "print the JSON document", group=GENERAL)  # type: ignore[assignment]


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


def check_url_characters(url: str) -> None:
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
