"""Who is told, and what is kept, when the sidecar acts: webhooks, Kubernetes Events, vLLM's log, incidents. No I/O."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, field_validator

from sidecar.shell.settings.declare import TELLING, setting
from sidecar.shell.settings.reading import check_url_characters


class NotifySection(BaseModel):
    """Notifications, and the evidence the sidecar reads and keeps about why vLLM died."""

    section: ClassVar[str] = "notify"  # its table in a config file

    webhook_url: str | None = setting(
        None,
        "where notifications are POSTed",
        why="where notifications are POSTed; never logged or shown",
        group=TELLING,
        form="an http(s) URL",
        metavar="URL",
        repr=False,  # so a settings object printed in a traceback or a debugger does not show it either
    )
    webhook_format: Literal["json", "slack"] = setting(
        "json",
        "notification body",
        group=TELLING,
        why="`json`, or `slack` (an incoming-webhook `text`)",
    )
    webhook_hmac_key_file: Path | None = setting(
        None,
        "key file that signs notifications",
        group=TELLING,
        form="a path",
        why="key to sign notifications with (`X-Vllm-Sidecar-Signature: sha256=...` over `timestamp.body`)",
    )
    kubernetes_events: bool = setting(
        False,
        "also post Kubernetes Events",
        group=TELLING,
        why="report pauses, resumes and restarts as Events on this pod",
    )
    vllm_log: Path | None = setting(
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
    incidents_keep: int = setting(
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
    incident_timeout: float = setting(
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
    incident_max_bytes: int = setting(
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

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value is not None:
            check_url_characters(value)
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("not an http(s) URL with a host")  # the URL itself is not repeated: a secret
        return value
