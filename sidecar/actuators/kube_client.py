"""A small async client for the Kubernetes API over httpx: auth, TLS, one deadline, bounded answers. Network I/O.

It sends one request and hands back the status and the JSON answer; what an answer means is the caller's
business. Two things it does on its own: it adds the bearer token, re-reading a token file every minute
and right after a 401 (service account tokens rotate; a 401 means the request was not processed, so one
retry with the new token is safe), and it turns every transport failure (timeout, refused connection,
TLS error, an answer over the size cap) into a one-line `KubeTransportError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from sidecar.actuators.kube_credentials import KubeCredentials
from sidecar.body_cap import BodyTooLargeError, read_capped
from sidecar.file_cap import read_capped_file

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
TOKEN_REREAD_S = 60.0  # client-go re-reads a projected token file at this period too
_MAX_BODY_BYTES = 8 * 2**20  # a Pod with managedFields is tens of KiB; anything near this is not an answer to us
_USER_AGENT = "vllm-sidecar"
_MAX_TOKEN_BYTES = 64 * 2**10  # a service account JWT is 1-2 KiB; OIDC tokens with many claims stay far below this


class KubeTransportError(Exception):
    """A request did not get an answer (timeout, connection, TLS, oversize); one line naming the request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeResponse:
    status_code: int
    document: dict[str, object] | None  # the JSON object answered, None when the body was not one
    message: str  # a Status answer's message (one line), else the HTTP reason phrase
    reason: str  # a Status answer's reason (`Forbidden`, `TooManyRequests`, ...), else ""
    cause_reasons: tuple[str, ...]  # reasons of the Status's details.causes (`DisruptionBudget`)
    body: bytes = b""  # the answer as sent: what a text answer (a pod's log) is read from


class KubeClient:
    def __init__(
        self,
        credentials: KubeCredentials,
        *,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.credentials = credentials
        self._timeout_s = timeout_s
        self._clock = clock
        self._token: str | None = credentials.token
        self._token_read_at: float | None = None
        self._http = httpx.AsyncClient(
            base_url=credentials.server,
            verify=ssl_context(credentials),
            timeout=httpx.Timeout(timeout_s),
            headers={"User-Agent": _USER_AGENT, "Accept": JSON},
            proxy=credentials.proxy_url,
            trust_env=False,  # the API server is reached directly unless the kubeconfig names a proxy
            transport=transport,
        )
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, object] | None = None,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
    ) -> KubeResponse:
        """Send one request; a 401 with a token file gets one retry with the re-read token."""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        answer = await self._send(method, path, content, content_type, params)
        if answer.status_code == httpx.codes.UNAUTHORIZED and self._reread_token():
            answer = await self._send(method, path, content, content_type, params)
        return answer

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._http.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        content: bytes | None,
        content_type: str,
        params: Mapping[str, str] | None,
    ) -> KubeResponse:
        what = f"{method} {path}"
        if self._closed:
            raise KubeTransportError(f"{what}: the client is closed")
        headers = {"Content-Type": content_type} if content is not None else {}
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with asyncio.timeout(self._timeout_s):
                request = self._http.build_request(method, path, content=content, headers=headers, params=params)
                response = await self._http.send(request, stream=True)
                try:
                    raw = await _read_capped(response, what)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise KubeTransportError(
                f"{what}: no answer from {self.credentials.server} within {self._timeout_s:g} s"
            ) from None
        except httpx.ConnectError as error:
            raise KubeTransportError(f"{what}: cannot connect to {self.credentials.server}: {_reason(error)}") from None
        except httpx.HTTPError as error:
            raise KubeTransportError(f"{what}: {type(error).__name__}: {_reason(error)}") from None
        return _response(response.status_code, response.reason_phrase, raw)

    def _current_token(self) -> str | None:
        file = self.credentials.token_file
        if file is None:
            return self._token
        if self._token_read_at is None or self._clock() - self._token_read_at >= TOKEN_REREAD_S:
            self._reread_token()
        if self._token is None:  # never read: sending no token would only earn a 403 as system:anonymous
            raise KubeTransportError(f"cannot read a bearer token from {file}")
        return self._token

    def _reread_token(self) -> bool:
        """Read the token file again; True when it gave a token different from the one just used."""
        file = self.credentials.token_file
        if file is None:
            return False
        self._token_read_at = self._clock()
        try:
            token = read_capped_file(file, _MAX_TOKEN_BYTES).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return False  # the request then goes out with the old token and its 401 says enough
        changed = token != self._token
        self._token = token or self._token
        return changed and bool(token)


def ssl_context(credentials: KubeCredentials) -> ssl.SSLContext:
    """Trust the cluster CA (or the system store, or nothing when told to skip), with the client cert if any."""
    if credentials.ca_pem and not credentials.insecure_skip_tls_verify:
        context = ssl.create_default_context(cadata=credentials.ca_pem)
    else:
        context = ssl.create_default_context()
    if credentials.insecure_skip_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if credentials.client_cert_pem and credentials.client_key_pem:
        _load_client_cert(context, credentials.client_cert_pem, credentials.client_key_pem)
    return context


def _load_client_cert(context: ssl.SSLContext, cert_pem: str, key_pem: str) -> None:
    """`load_cert_chain` takes only files: write both to a private folder, load, and remove it at once."""
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-kube-") as folder:
        cert, key = Path(folder) / "client.crt", Path(folder) / "client.key"
        for path, text in ((cert, cert_pem), (key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(text)
        context.load_cert_chain(cert, key)


async def _read_capped(response: httpx.Response, what: str) -> bytes:
    try:
        return await read_capped(response, _MAX_BODY_BYTES)
    except BodyTooLargeError:
        raise KubeTransportError(f"{what}: answer exceeds {_MAX_BODY_BYTES} bytes") from None


def _response(status_code: int, reason_phrase: str, raw: bytes) -> KubeResponse:
    document: dict[str, object] | None = None
    with contextlib.suppress(ValueError):
        parsed = json.loads(raw)
        document = parsed if isinstance(parsed, dict) else None
    message, reason = reason_phrase, ""
    causes: tuple[str, ...] = ()
    if document is not None and document.get("kind") == "Status":
        text = document.get("message")
        message = one_line(text) if isinstance(text, str) and text else reason_phrase
        reason = str(document.get("reason") or "")
        details = document.get("details")
        found = details.get("causes") if isinstance(details, dict) else None
        causes = (
            tuple(str(c.get("reason", "")) for c in found if isinstance(c, dict)) if isinstance(found, list) else ()
        )
    return KubeResponse(
        status_code=status_code, document=document, message=message, reason=reason, cause_reasons=causes, body=raw
    )


def one_line(text: str, limit: int = 400) -> str:
    """Whitespace collapsed, cut to `limit` characters: what goes into an outcome's detail."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _reason(error: Exception) -> str:
    return one_line(str(error)) or type(error).__name__
