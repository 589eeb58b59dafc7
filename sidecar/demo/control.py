"""The demo's control endpoint: where its restart command asks for the simulator's restart. Does network I/O.

`POST /restart` on 127.0.0.1, with `Authorization: Bearer <token>` (the token is in a 0600 file in the demo's
0700 working directory, so only its user can ask), the restart's reason as the body. The answer comes once
the old simulator is stopped and the new one started, as `systemctl restart` returns once its job is done;
the sidecar then waits for vLLM's /health itself.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path

from sidecar.exporter.server import HttpServer, Request, Response

MAX_REASON_BYTES = 4096


def write_token(path: Path) -> str:
    """A fresh random token, written readable by this user only."""
    token = secrets.token_urlsafe(24)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(token + "\n")
    return token


class ControlServer:
    def __init__(self, token: str, restart: Callable[[str], Awaitable[str]]) -> None:
        self._token = token
        self._restart = restart
        self._http = HttpServer(host="127.0.0.1", port=0, handler=self._handle, max_body_bytes=MAX_REASON_BYTES)

    async def start(self) -> None:
        await self._http.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.port}/restart"

    async def stop(self) -> None:
        await self._http.stop()

    async def _handle(self, request: Request) -> Response:
        if request.path != "/restart":
            return Response.text(HTTPStatus.NOT_FOUND, f"not found: {request.path}")
        if request.method != "POST":
            return Response(status=HTTPStatus.METHOD_NOT_ALLOWED, body=b"POST only\n", headers={"Allow": "POST"})
        presented = request.headers.get("authorization", "")
        if not hmac.compare_digest(presented.encode(), f"Bearer {self._token}".encode()):
            return Response.text(HTTPStatus.FORBIDDEN, "wrong or missing token")
        try:
            line = await self._restart(request.body.decode(errors="replace").strip())
        except RuntimeError as error:
            return Response.text(HTTPStatus.CONFLICT, str(error))
        return Response.text(HTTPStatus.OK, line)
