"""Routes of the daemon's HTTP server: /metrics, /healthz, /readyz, /status. No I/O of its own.

/metrics speaks the format the scraper asks for: OpenMetrics when its Accept header names
`application/openmetrics-text` (Prometheus does by default), else the Prometheus text format; prometheus_client
chooses and writes both.

One tuning of the library: under the default name escaping (`underscores`), prometheus_client 0.26 writes every
OpenMetrics sample's name a character at a time (`openmetrics.exposition._escape`), about half the CPU of a
Prometheus scrape. Every name this registry serves is a legacy Prometheus name, which `underscores` and
`allow-utf-8` both write unchanged, so the OpenMetrics writer is called with `allow-utf-8`: the same bytes
(tests/adapters/test_metrics_format.py compares them), under the same content type, for less CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import ALLOWUTF8, UNDERSCORES
from prometheus_client.openmetrics.exposition import generate_latest as write_openmetrics
from structlog.typing import FilteringBoundLogger

from sidecar.exporter.admin import AdminAuth
from sidecar.exporter.rate_limit import AdminRateLimiter
from sidecar.exporter.server import Request, Response
from sidecar.model.acting import ActingView
from sidecar.model.status import StartingStatus, StatusDocument
from sidecar.model.view import View
from sidecar.report.document import finite, policy_document, status_document


@dataclass(frozen=True, slots=True, kw_only=True)
class Liveness:
    alive: bool
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    admitting: bool
    reason: str


class AdminActions(Protocol):
    """What the admin API may do; `caller` is the client's address, for the log."""

    def pause(self, caller: str) -> str: ...

    def resume(self, caller: str) -> str: ...

    def restart(self, caller: str) -> str: ...


ADMIN_PATHS = {"/admin/pause": "pause", "/admin/resume": "resume", "/admin/restart": "restart"}


class Endpoints:
    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        latest_view: Callable[[], View | None],
        liveness: Callable[[], Liveness],
        vllm_url: str,
        version: str,
        readiness: Callable[[], Readiness] | None = None,
        acting_view: Callable[[], ActingView | None] = lambda: None,
        admin: AdminActions | None = None,
        admin_auth: AdminAuth | None = None,
        admin_rate_limiter: AdminRateLimiter | None = None,
        logger: FilteringBoundLogger | None = None,
    ) -> None:
        self._registry = registry
        self._latest_view = latest_view
        self._liveness = liveness
        self._vllm_url = vllm_url
        self._version = version
        self._readiness = readiness
        self._acting_view = acting_view
        self._admin = admin
        self._admin_auth = admin_auth if admin_auth is not None else AdminAuth(None)
        self._admin_rate_limiter = admin_rate_limiter
        self._log = logger
        self._routes: dict[str, Callable[[], Response]] = {
            "/metrics": self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": self._status,
        }

    async def handle(self, request: Request) -> Response:
        if request.path.startswith("/admin/"):
            # Before anything else, so a refused token costs a token too; never on the probe routes below.
            limited = self._admin_rate_limited(request)
            if limited is not None:
                return limited
        if request.path in ADMIN_PATHS:
            return self._admin_call(request, ADMIN_PATHS[request.path])
        route = self._routes.get(request.path)
        if route is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"no such endpoint: {request.path}")
        if request.method not in ("GET", "HEAD"):
            return Response(status=HTTPStatus.METHOD_NOT_ALLOWED, body=b"use GET\n", headers={"Allow": "GET, HEAD"})
        if request.path == "/metrics":
            return self._metrics(request.headers.get("accept", ""))
        return route()

    def _metrics(self, accept: str = "") -> Response:
        encoder, content_type = _encoder(accept)
        return Response(status=HTTPStatus.OK, body=encoder(self._registry), content_type=content_type)

    def _healthz(self) -> Response:
        liveness = self._liveness()
        return Response.text(HTTPStatus.OK if liveness.alive else HTTPStatus.SERVICE_UNAVAILABLE, liveness.reason)

    def _readyz(self) -> Response:
        if self._readiness is None:
            return Response.text(HTTPStatus.OK, "ready: admitting traffic")
        readiness = self._readiness()
        return Response.text(HTTPStatus.OK if readiness.admitting else HTTPStatus.SERVICE_UNAVAILABLE, readiness.reason)

    def _admin_rate_limited(self, request: Request) -> Response | None:
        if self._admin_rate_limiter is None:
            return None
        admission = self._admin_rate_limiter.admit(request.peer)
        if admission.allowed:
            return None
        if admission.first_refusal and self._log is not None:
            self._log.warning("admin_rate_limited", caller=request.peer, retry_after_s=admission.retry_after_s)
        return Response(
            status=HTTPStatus.TOO_MANY_REQUESTS,
            body=f"too many admin requests: retry in {admission.retry_after_s} s\n".encode(),
            headers={"Retry-After": str(admission.retry_after_s)},
        )

    def _admin_call(self, request: Request, action: str) -> Response:
        if request.method != "POST":
            return Response(status=HTTPStatus.METHOD_NOT_ALLOWED, body=b"use POST\n", headers={"Allow": "POST"})
        auth = self._admin_auth.check(request.headers.get("authorization"))
        if not auth.allowed or self._admin is None:
            reason = auth.reason if not auth.allowed else "the admin API is off: no policy runs here"
            status = auth.status if not auth.allowed else HTTPStatus.FORBIDDEN
            if self._log is not None:
                # The record of a refused override; what was presented is never logged, only that it failed.
                self._log.warning(
                    "admin_refused", action=action, caller=request.peer, status=int(status), reason=reason
                )
            headers = {"WWW-Authenticate": 'Bearer realm="vllm-sidecar"'} if status == HTTPStatus.UNAUTHORIZED else {}
            return Response(status=status, body=(reason + "\n").encode(), headers=headers)
        outcome: str = getattr(self._admin, action)(request.peer)
        return Response(
            status=HTTPStatus.OK,
            body=json.dumps({"action": action, "result": outcome}).encode() + b"\n",
            content_type="application/json",
        )

    def _status(self) -> Response:
        view = self._latest_view()
        body: StatusDocument | StartingStatus = (
            StartingStatus(sidecar={"version": self._version}, state="starting: no poll yet")
            if view is None
            else status_document(view.snapshot, view.derived, self._vllm_url, version=self._version)
        )
        acting = self._acting_view()
        if acting is not None:
            body["policy"] = policy_document(acting)
        return Response(
            status=HTTPStatus.OK,
            # A derived value can overflow to infinity even from finite inputs (a denormal request count): null.
            body=json.dumps(finite(body), indent=2, allow_nan=False, default=str).encode() + b"\n",
            content_type="application/json",
        )


def _encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus_client's choice of format for an Accept header; the text format for one it cannot read."""
    try:
        encoder, content_type = choose_encoder(accept)
    except (TypeError, ValueError):  # a version it cannot compare ("version=abc"): the library raises
        return choose_encoder("")
    if not (content_type.isascii() and content_type.isprintable()):  # it echoes the version it was sent
        return choose_encoder("")
    media_type, *parameters = (part.strip() for part in content_type.split(";"))
    values = dict(part.split("=", 1) for part in parameters if "=" in part)
    if (
        media_type == "application/openmetrics-text"
        and "version" in values
        and values.get("escaping", UNDERSCORES) == UNDERSCORES
    ):
        # Legacy names only (see the module's docstring): the same bytes without the per-character escaping.
        writer = partial(write_openmetrics, escaping=ALLOWUTF8, version=values["version"])
        return writer, content_type
    return encoder, content_type
