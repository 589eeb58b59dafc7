"""A small async client for the Kubernetes API on lightkube's httpx client: one deadline, bounded answers. Network I/O.

lightkube builds the httpx client from the credentials (`kube_credentials`): the base URL, TLS with the
cluster CA and any client certificate, and the authentication, which re-reads a token file after a 401 (a
401 means the request was not processed, so the one retry is safe); an exec plugin's or oidc's comes from
`kube_auth` in its place. The kubeconfig's impersonation headers go on every request and its
`tls-server-name` is the name the server's certificate is checked against. Here: one request sent, its
answer read with a size cap, and the status and JSON handed back; what an answer means is the caller's
business. Every failure to get an answer (timeout, refused connection, TLS, an answer over the cap,
credentials that could not be had) becomes a one-line `KubeTransportError`.

The typed lightkube client is not used: it reads answers whole (no cap), has no `previous` or `limitBytes`
for a pod's log, and no policy/v1beta1 Eviction for API servers before 1.22; the paths here are built
from names `kube_names` has validated.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace

import httpx
from lightkube.config.client_adapter import ConnectionParams, user_cert
from lightkube.config.models import User
from lightkube.core.exceptions import ConfigError

from sidecar.actuators.kube_auth import CredentialPluginError, ExecCredentialAuth
from sidecar.actuators.kube_credentials import KubeCredentials
from sidecar.body_cap import BodyTooLargeError, send_capped
from sidecar.model.text import one_line

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_MAX_BODY_BYTES = 8 * 2**20  # a Pod with managedFields is tens of KiB; anything near this is not an answer to us
_USER_AGENT = "vllm-sidecar"


class KubeTransportError(Exception):
    """A request did not get an answer (timeout, connection, TLS, oversize, credentials); one line naming it."""


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
    ) -> None:
        self.credentials = credentials
        self._timeout_s = timeout_s
        # trust_env=False: the API server is reached directly unless the kubeconfig names a proxy
        params = ConnectionParams(timeout=httpx.Timeout(timeout_s), trust_env=False, proxy=credentials.proxy_url)
        # lightkube's httpx arguments (base URL, TLS context, authentication), as its AsyncClient adapter
        # passes them; a test's transport is added here, as ConnectionParams would deep-copy it
        config = credentials.config
        if credentials.auth is not None and config.user is not None:  # lightkube would refuse or run these itself
            config = config._replace(user=replace(config.user, exec=None, auth_provider=None))
        arguments = params.httpx_params(config)
        arguments["transport"] = transport
        if credentials.auth is not None:
            arguments["auth"] = credentials.auth
        if isinstance(credentials.auth, ExecCredentialAuth) and isinstance(arguments["verify"], ssl.SSLContext):
            # A plugin may answer a client certificate (and a new one when it expires): it is loaded into the
            # TLS context, and no connection is kept alive, so each request shows the current one. The adapter
            # sends a handful of requests per restart, so a handshake each costs nothing that matters.
            credentials.auth.certificate_sink = functools.partial(_load_certificate, arguments["verify"])
            arguments["limits"] = httpx.Limits(max_keepalive_connections=0)
        arguments["headers"] = httpx.Headers(
            [("User-Agent", _USER_AGENT), ("Accept", JSON), *credentials.impersonation]
        )
        self._http = httpx.AsyncClient(**arguments)
        # httpcore connects with this name as SNI and checks the certificate against it
        self._extensions = {"sni_hostname": credentials.tls_server_name} if credentials.tls_server_name else {}
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
        """Send one request (lightkube's authentication retries it once after a 401) and read the answer."""
        what = f"{method} {path}"
        if self._closed:
            raise KubeTransportError(f"{what}: the client is closed")
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type} if content is not None else {}
        server = self.credentials.server
        try:
            async with asyncio.timeout(self._timeout_s):  # the exec plugin's run included
                request = self._http.build_request(
                    method, path, content=content, headers=headers, params=params, extensions=self._extensions
                )
                response, raw = await send_capped(self._http, request, _MAX_BODY_BYTES)
        except BodyTooLargeError:
            raise KubeTransportError(f"{what}: answer exceeds {_MAX_BODY_BYTES} bytes") from None
        except TimeoutError:
            raise KubeTransportError(f"{what}: no answer from {server} within {self._timeout_s:g} s") from None
        except httpx.ConnectError as error:
            raise KubeTransportError(f"{what}: cannot connect to {server}: {_reason(error)}") from None
        except httpx.HTTPError as error:
            raise KubeTransportError(f"{what}: {type(error).__name__}: {_reason(error)}") from None
        except CredentialPluginError as error:  # an exec plugin or the identity provider gave no token; never sent
            raise KubeTransportError(f"{what}: no credentials from {self.credentials.source}: {error}") from None
        except (ConfigError, OSError, ValueError, KeyError) as error:
            # from lightkube's authentication: a token file gone; never sent
            raise KubeTransportError(
                f"{what}: no credentials from {self.credentials.source}: {type(error).__name__}: {_reason(error)}"
            ) from None
        return _response(response.status_code, response.reason_phrase, raw)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._http.aclose()


def _load_certificate(context: ssl.SSLContext, certificate_pem: str, key_pem: str) -> None:
    """An exec plugin's client certificate into the TLS context, as lightkube loads a kubeconfig's inline one:
    OpenSSL reads only files, so its `user_cert` writes each to a private temporary file, deleted when dropped."""
    inline = User(client_cert_data=_base64(certificate_pem), client_key_data=_base64(key_pem))
    files = user_cert(inline, str)
    assert files is not None  # noqa: S101 - the data is set
    context.load_cert_chain(*files)


def _base64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()


def _response(status_code: int, reason_phrase: str, raw: bytes) -> KubeResponse:
    document: dict[str, object] | None = None
    with contextlib.suppress(ValueError):
        parsed = json.loads(raw)
        document = parsed if isinstance(parsed, dict) else None
    message, reason = reason_phrase, ""
    causes: tuple[str, ...] = ()
    if document is not None and document.get("kind") == "Status":
        text = document.get("message")
        message = one_line(text, limit=400) if isinstance(text, str) and text else reason_phrase
        reason = str(document.get("reason") or "")
        details = document.get("details")
        found = details.get("causes") if isinstance(details, dict) else None
        causes = (
            tuple(str(c.get("reason", "")) for c in found if isinstance(c, dict)) if isinstance(found, list) else ()
        )
    return KubeResponse(
        status_code=status_code, document=document, message=message, reason=reason, cause_reasons=causes, body=raw
    )


def _reason(error: Exception) -> str:
    return one_line(str(error), limit=400) or type(error).__name__
