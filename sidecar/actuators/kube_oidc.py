"""The `oidc` auth-provider of a kubeconfig user, as client-go runs it. I/O.

The id-token is the bearer until its `exp` is 10 s away; then the refresh-token buys a new one at the issuer's
token endpoint (OpenID discovery, an OAuth 2.0 refresh grant, the client authenticated with HTTP Basic as RFC
6749 asks servers to accept). lightkube refuses the form; the loaders that run it leave the issuer's TLS
unverified without an idp CA. kubectl writes refreshed tokens back into the kubeconfig; the sidecar keeps them in
memory only. Async only (the sidecar's client is); failures are `CredentialPluginError`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass, field
from urllib.parse import quote_plus

import httpx

from sidecar.actuators.kube_auth import EXPIRY_MARGIN_S, CredentialPluginError
from sidecar.body_cap import BodyTooLargeError, send_capped
from sidecar.model.text import one_line

MAX_IDP_ANSWER_BYTES = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class OidcProvider:
    """A kubeconfig user's `auth-provider: {name: oidc, config: ...}`."""

    issuer_url: str | None
    client_id: str | None
    client_secret: str | None = None
    id_token: str | None = None
    refresh_token: str | None = field(default=None, repr=False)
    ca_pem: str | None = None  # idp-certificate-authority(-data); else certifi's bundle, httpx's default


class OidcAuth(httpx.Auth):
    def __init__(
        self,
        provider: OidcProvider,
        *,
        wall_clock: Callable[[], float] = time.time,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._provider = provider
        self._wall_clock = wall_clock
        self._timeout_s = timeout_s
        self._transport = transport
        self._id_token = provider.id_token
        self._refresh_token = provider.refresh_token
        self._lock = asyncio.Lock()

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        raise RuntimeError("the oidc auth-provider runs on the async client only")

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        async with self._lock:
            if self._id_token is None or self._expired(self._id_token):
                self._id_token = await self._refresh()
            token = self._id_token
        request.headers["Authorization"] = f"Bearer {token}"
        yield request

    def _expired(self, id_token: str) -> bool:
        """client-go's test: the JWT's `exp` (read, not verified: the API server verifies) minus 10 s is past;
        a token whose expiry cannot be read counts as expired."""
        expiry = jwt_expiry(id_token)
        return expiry is None or self._wall_clock() >= expiry - EXPIRY_MARGIN_S

    async def _refresh(self) -> str:
        provider, refresh_token = self._provider, self._refresh_token
        missing = [
            name
            for name, value in (
                ("refresh-token", refresh_token),
                ("idp-issuer-url", provider.issuer_url),
                ("client-id", provider.client_id),
            )
            if not value
        ]
        if missing or provider.issuer_url is None or provider.client_id is None or refresh_token is None:
            state = "has expired" if self._id_token else "is missing"
            raise CredentialPluginError(
                f"the oidc id-token {state} and the auth-provider config has no {', '.join(missing)} to refresh it "
                "(log in again, or use an exec plugin such as kubelogin)"
            )
        verify: ssl.SSLContext | bool = True
        if provider.ca_pem is not None:
            verify = ssl.create_default_context(cadata=provider.ca_pem)
        issuer = provider.issuer_url.rstrip("/")
        async with httpx.AsyncClient(verify=verify, timeout=self._timeout_s, transport=self._transport) as http:
            discovery = await _json(http, http.build_request("GET", f"{issuer}/.well-known/openid-configuration"))
            endpoint = discovery.get("token_endpoint")
            if not isinstance(endpoint, str) or not endpoint.startswith("https://"):
                raise CredentialPluginError(f"the oidc issuer {issuer} names no https token_endpoint in its discovery")
            form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
            auth: httpx.BasicAuth | None = None
            if provider.client_secret:
                auth = httpx.BasicAuth(quote_plus(provider.client_id), quote_plus(provider.client_secret))
            else:  # a public client names itself in the form
                form["client_id"] = provider.client_id
            request = http.build_request("POST", endpoint, data=form, headers={"Accept": "application/json"})
            answer = await _json(http, request, auth=auth)
        id_token = answer.get("id_token")
        if not isinstance(id_token, str) or not id_token:
            raise CredentialPluginError(f"the oidc issuer {issuer} answered the refresh without an id_token")
        new_refresh = answer.get("refresh_token")
        if isinstance(new_refresh, str) and new_refresh:  # issuers that rotate refresh tokens send the next one
            self._refresh_token = new_refresh
        return id_token


async def _json(
    http: httpx.AsyncClient, request: httpx.Request, *, auth: httpx.Auth | None = None
) -> dict[str, object]:
    """The JSON object an identity provider answers; its OAuth error (RFC 6749 5.2) or status in one line."""
    what = f"the oidc issuer's {request.url.copy_with(query=None)}"
    try:
        response, raw = await send_capped(http, request, MAX_IDP_ANSWER_BYTES, auth=auth)
    except BodyTooLargeError:
        raise CredentialPluginError(f"{what} answered over {MAX_IDP_ANSWER_BYTES} bytes") from None
    except httpx.HTTPError as error:
        raise CredentialPluginError(f"{what}: {type(error).__name__}: {one_line(str(error))}") from None
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise CredentialPluginError(f"{what} answered HTTP {response.status_code} without a JSON object")
    if response.status_code != 200:
        code, description = document.get("error"), document.get("error_description")
        said = f": {code}" + (f" ({one_line(str(description))})" if description else "") if code else ""
        raise CredentialPluginError(f"{what} answered HTTP {response.status_code}{said}")
    return document


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT, unverified; None when the token is not a JWT with a numeric `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    expiry = claims.get("exp") if isinstance(claims, dict) else None
    return float(expiry) if isinstance(expiry, int | float) and not isinstance(expiry, bool) else None
