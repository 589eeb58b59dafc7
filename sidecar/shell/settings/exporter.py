"""The sidecar's own HTTP server: where it listens, TLS, and the admin API. No I/O."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, field_validator

from sidecar.config.address import split_listen
from sidecar.exporter.rate_limit import RateLimit, parse_rate_limit
from sidecar.shell.settings.declare import SERVING, setting


class ExporterSection(BaseModel):
    """`/metrics`, `/readyz`, `/status` and `/admin/*`: the server's address, its certificate, the admin API."""

    section: ClassVar[str] = "exporter"  # its table in a config file

    listen: str = setting(
        "0.0.0.0:9468",
        "where the sidecar serves",
        group=SERVING,
        form="HOST:PORT with a port from 0 to 65535 ([::1]:PORT for IPv6)",
        metavar="HOST:PORT",
        why="`HOST:PORT` of the sidecar's own HTTP server (`[::1]:PORT` for IPv6)",
    )
    admin_token_file: Path | None = setting(
        None,
        "token of POST /admin/* (unset: off)",
        group=SERVING,
        form="a path",
        why="bearer token (16+ characters) of `POST /admin/*`; without it the admin API is off",
    )
    admin_rate_limit: str = setting(
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
    tls_cert_file: Path | None = setting(
        None,
        "PEM certificate chain: serve HTTPS",
        why=(
            "PEM certificate chain: serve HTTPS (TLS 1.2+) instead of HTTP; re-read when it changes; with "
            "`--tls-key-file`"
        ),
        group=SERVING,
        form="a path, together with --tls-key-file",
    )
    tls_key_file: Path | None = setting(
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

    @field_validator("admin_rate_limit")
    @classmethod
    def _check_rate_limit(cls, value: str) -> str:
        parse_rate_limit(value)
        return value.strip()

    @property
    def listen_address(self) -> tuple[str, int]:
        return split_listen(self.listen)

    @property
    def admin_rate(self) -> RateLimit:
        return parse_rate_limit(self.admin_rate_limit)
