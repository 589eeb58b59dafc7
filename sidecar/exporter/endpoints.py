"""Routes of the daemon's HTTP server: /metrics, /healthz, /readyz, /status. No I/O of its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.exporter.http import Request, Response
from sidecar.model.view import View
from sidecar.report.document import status_document


@dataclass(frozen=True, slots=True, kw_only=True)
class Liveness:
    alive: bool
    reason: str


class Endpoints:
    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        latest_view: Callable[[], View | None],
        liveness: Callable[[], Liveness],
        vllm_url: str,
        version: str,
    ) -> None:
        self._registry = registry
        self._latest_view = latest_view
        self._liveness = liveness
        self._vllm_url = vllm_url
        self._version = version
        self._routes: dict[str, Callable[[], Response]] = {
            "/metrics": self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": self._status,
        }

    async def handle(self, request: Request) -> Response:
        route = self._routes.get(request.path)
        if route is None:
            return Response.text(HTTPStatus.NOT_FOUND, f"no such endpoint: {request.path}")
        if request.method not in ("GET", "HEAD"):
            return Response(status=HTTPStatus.METHOD_NOT_ALLOWED, body=b"use GET\n", headers={"Allow": "GET, HEAD"})
        return route()

    def _metrics(self) -> Response:
        return Response(status=HTTPStatus.OK, body=generate_latest(self._registry), content_type=CONTENT_TYPE_LATEST)

    def _healthz(self) -> Response:
        liveness = self._liveness()
        return Response.text(HTTPStatus.OK if liveness.alive else HTTPStatus.SERVICE_UNAVAILABLE, liveness.reason)

    def _readyz(self) -> Response:
        # Admission is never paused until the policy engine exists; readiness then follows its decision.
        return Response.text(HTTPStatus.OK, "ready: admitting traffic")

    def _status(self) -> Response:
        view = self._latest_view()
        if view is None:
            body: dict[str, object] = {
                "sidecar": {"version": self._version},
                "state": "starting: no poll yet",
            }
        else:
            body = status_document(view.snapshot, view.derived, self._vllm_url, version=self._version)
        return Response(
            status=HTTPStatus.OK,
            body=json.dumps(body, indent=2, allow_nan=False, default=str).encode() + b"\n",
            content_type="application/json",
        )
