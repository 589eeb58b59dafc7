"""Authentication no Python kubeconfig loader does as a daemon needs: exec plugins as kubectl runs them, oidc. I/O.

lightkube authenticates a kubeconfig's token, `tokenFile`, client certificate and username/password. For the
other two forms kubectl accepts, these `httpx.Auth` flows do what client-go does; kubernetes_asyncio's and the
official client's loaders were weighed and not taken (docs/kubernetes-credentials.md, "Who carries what"):

- `ExecCredentialAuth`: the exec plugin (`aws eks get-token`, `gke-gcloud-auth-plugin`, `kubelogin`), in each
  ExecCredential version kubectl speaks (v1, v1beta1, v1alpha1). The plugin gets `KUBERNETES_EXEC_INFO`
  (non-interactive; the cluster when `provideClusterInfo` asks for it), its token or client certificate
  (`tsh kube credentials` answers one) is kept until its `expirationTimestamp` (or, without one, until a
  401), a plugin still running when the request's deadline passes is killed, and a failure is one line with
  the end of what the plugin printed on stderr. lightkube's own runner takes v1beta1/v1alpha1 only, passes
  no `KUBERNETES_EXEC_INFO` and takes no certificate; no loader kills a plugin at the deadline or caps its output.
- `OidcAuth`: the `oidc` auth-provider. The id-token is the bearer until its `exp` is 10 s away; then the
  refresh-token buys a new one at the issuer's token endpoint (OpenID discovery, an OAuth 2.0 refresh grant,
  the client authenticated with HTTP Basic as RFC 6749 asks servers to accept). lightkube refuses the form;
  the loaders that run it leave the issuer's TLS unverified without an idp CA.
  kubectl writes refreshed tokens back into the kubeconfig; the sidecar keeps them in memory only.

Both are async only (the sidecar's client is), and their failures are `CredentialPluginError`, which the
client reports as "no credentials from <kubeconfig>".
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import signal
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote, quote_plus

import httpx

from sidecar.body_cap import BodyTooLargeError, send_capped
from sidecar.model.text import one_line

EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
)
_V1ALPHA1 = EXEC_API_VERSIONS[2]
MAX_PLUGIN_OUTPUT_BYTES = 2**20  # an ExecCredential is a token or a certificate: a few KiB
MAX_IDP_ANSWER_BYTES = 2**20
STDERR_KEPT_BYTES = 4096  # what a plugin says last on stderr is why it failed ("run aws sso login")
STDERR_TAIL_CHARS = 300
# client-go's oidc refreshes an id-token this long before it expires, so a request never carries one that
# expires on the way; the same margin is used for an exec plugin's expirationTimestamp.
EXPIRY_MARGIN_S = 10.0


class CredentialPluginError(Exception):
    """No token could be had from the exec plugin or the identity provider; one line saying why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecPlugin:
    """A kubeconfig user's `exec` entry, its command resolved as kubectl resolves it."""

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cluster: Mapping[str, object] | None = None  # given to the plugin when provideClusterInfo is true


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecCredential:
    """What a plugin answered: a bearer token, or a client certificate and its key (PEM)."""

    token: str | None = None
    certificate: tuple[str, str] | None = field(default=None, repr=False)
    expires_at: float | None = None  # seconds since the epoch; None: until the API server says 401


# Where a plugin's client certificate goes: the client's TLS context, for the connections it opens next.
CertificateSink = Callable[[str, str], None]


class ExecCredentialAuth(httpx.Auth):
    def __init__(
        self,
        plugin: ExecPlugin,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._plugin = plugin
        self._wall_clock = wall_clock
        self._credential: ExecCredential | None = None
        self._lock = asyncio.Lock()  # concurrent requests (a pod's two logs) run the plugin once
        self.certificate_sink: CertificateSink | None = None  # set by the client that can present one

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        raise RuntimeError("the exec credential plugin runs on the async client only")

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        async with self._lock:
            kept = self._credential
            cached = kept is not None and not self._expired(kept)
            credential = kept if cached and kept is not None else await self._run()
        _present(request, credential)
        response = yield request
        if response.status_code == 401 and cached:  # revoked or rotated early: one new credential, one retry
            async with self._lock:
                fresh = self._credential is not credential and self._credential is not None
                credential = self._credential if fresh and self._credential is not None else await self._run()
            _present(request, credential)
            yield request

    def _expired(self, credential: ExecCredential) -> bool:
        expires_at = credential.expires_at
        return expires_at is not None and self._wall_clock() >= expires_at - EXPIRY_MARGIN_S

    async def _run(self) -> ExecCredential:
        plugin = self._plugin
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(self.exec_info())}
        try:
            process = await asyncio.create_subprocess_exec(
                plugin.command,
                *plugin.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: what it starts is killed with it
            )
        except OSError as error:
            raise CredentialPluginError(
                f"exec plugin {plugin.command!r} cannot be started: {error.strerror or error}"
            ) from None
        assert process.stdout is not None  # noqa: S101 - PIPE
        assert process.stderr is not None  # noqa: S101 - PIPE
        try:
            stdout, stderr = await asyncio.gather(
                _read_up_to(process.stdout, MAX_PLUGIN_OUTPUT_BYTES, process), _tail(process.stderr, STDERR_KEPT_BYTES)
            )
            if len(stdout) > MAX_PLUGIN_OUTPUT_BYTES:
                # Left unread at the cap, stdout's pipe may be paused (a full buffer) and never see its end, and
                # asyncio's wait() waits for every pipe's end: close them, or the request waits out its deadline.
                _close_pipes(process)
            await process.wait()
        except BaseException:  # the request's deadline passed: the plugin must not outlive it
            _kill(process)
            await process.wait()
            raise
        finally:
            _close_pipes(process)
        if len(stdout) > MAX_PLUGIN_OUTPUT_BYTES:
            raise CredentialPluginError(f"exec plugin {plugin.command!r} printed over {MAX_PLUGIN_OUTPUT_BYTES} bytes")
        if process.returncode != 0:
            raise CredentialPluginError(
                f"exec plugin {plugin.command!r} exited with {process.returncode}{_stderr_tail(stderr)}"
            )
        credential = parse_exec_credential(stdout, plugin.api_version, plugin.command)
        if credential.certificate is not None:
            if self.certificate_sink is None:
                raise CredentialPluginError(
                    f"exec plugin {plugin.command!r} answered a client certificate, which a plain-http server "
                    "cannot be shown"
                )
            try:  # from the next connection on (a client that presents one keeps none alive)
                self.certificate_sink(*credential.certificate)
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                raise CredentialPluginError(
                    f"exec plugin {plugin.command!r} answered a client certificate that cannot be loaded: "
                    f"{one_line(str(error)) or type(error).__name__}"
                ) from None
        self._credential = credential
        return credential

    def exec_info(self) -> dict[str, object]:
        """What client-go puts in KUBERNETES_EXEC_INFO: the version asked for, never interactive (a daemon
        has no terminal), and the cluster when the kubeconfig sets provideClusterInfo."""
        spec: dict[str, object] = {"interactive": False}
        if self._plugin.cluster is not None and self._plugin.api_version != _V1ALPHA1:
            spec["cluster"] = dict(self._plugin.cluster)
        return {"apiVersion": self._plugin.api_version, "kind": "ExecCredential", "spec": spec}


def _kill(process: asyncio.subprocess.Process) -> None:
    """The plugin and whatever it started (a wrapper script's child would hold our pipes open, and run on)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _close_pipes(process: asyncio.subprocess.Process) -> None:
    """Close the plugin's pipes now. asyncio closes a subprocess's transport only once every pipe has reached its
    end, and a pipe left unread (a plugin killed at the output cap: the paused pipe never sees its end) would be
    closed by the garbage collector, after the event loop closed, raising 'Event loop is closed' there."""
    transport = getattr(process, "_transport", None)  # Process has no public close
    if isinstance(transport, asyncio.SubprocessTransport):
        transport.close()


async def _read_up_to(stream: asyncio.StreamReader, limit: int, process: asyncio.subprocess.Process) -> bytes:
    """The stream to its end, or `limit` + 1 bytes and the process killed: a plugin cannot fill our memory."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            _kill(process)
            break
    return b"".join(chunks)


async def _tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    """The last `keep` bytes of the stream, read to its end (so the plugin never blocks on a full pipe)."""
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-keep:]
    return kept


def parse_exec_credential(output: bytes, api_version: str, command: str) -> ExecCredential:
    """The ExecCredential a plugin printed: its token or client certificate, and when it expires."""
    what = f"exec plugin {command!r}"
    try:
        document = json.loads(output)
    except ValueError:
        raise CredentialPluginError(f"{what} did not print an ExecCredential (not JSON)") from None
    if not isinstance(document, dict) or document.get("kind") != "ExecCredential":
        raise CredentialPluginError(f"{what} did not print an ExecCredential (no kind ExecCredential)")
    if document.get("apiVersion") != api_version:
        raise CredentialPluginError(
            f"{what} answered apiVersion {document.get('apiVersion')}, the kubeconfig asks for {api_version}"
        )
    status = document.get("status")
    status = status if isinstance(status, dict) else {}
    token, certificate, key = status.get("token"), status.get("clientCertificateData"), status.get("clientKeyData")
    expires_at = _expiry(status.get("expirationTimestamp"), what)
    if isinstance(token, str) and token:
        return ExecCredential(token=token, expires_at=expires_at)
    if isinstance(certificate, str) and certificate and isinstance(key, str) and key:
        return ExecCredential(certificate=(certificate, key), expires_at=expires_at)
    if certificate or key:
        raise CredentialPluginError(f"{what} answered a client certificate without its key, or a key without one")
    raise CredentialPluginError(f"{what} answered no status.token and no client certificate")


def _expiry(stamp: object, what: str) -> float | None:
    if stamp is None:
        return None
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        raise CredentialPluginError(f"{what} answered expirationTimestamp {stamp!r}, not RFC 3339") from None


def _present(request: httpx.Request, credential: ExecCredential) -> None:
    """The token as the bearer; a certificate goes in the TLS handshake, so no header then."""
    if credential.token is not None:
        request.headers["Authorization"] = f"Bearer {credential.token}"
    else:
        request.headers.pop("Authorization", None)


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


def impersonation_headers(user: Mapping[str, object], where: str) -> tuple[tuple[str, str], ...]:
    """The Impersonate-* headers of a kubeconfig user's `as`, `as-uid`, `as-groups` and `as-user-extra`."""
    name, uid = user.get("as"), user.get("as-uid")
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
        raise ValueError(f"{where}: as-groups is not a list of names")
    if not isinstance(extra, dict) or not all(
        isinstance(values, list) and all(isinstance(value, str) for value in values) for values in extra.values()
    ):
        raise ValueError(f"{where}: as-user-extra is not a mapping of names to lists of values")
    if not name:
        if uid or groups or extra:  # kubectl refuses these without a user to impersonate
            raise ValueError(f"{where}: as-uid, as-groups or as-user-extra is set without as (the user to act as)")
        return ()
    headers = [("Impersonate-User", str(name))]
    if uid:
        headers.append(("Impersonate-Uid", str(uid)))
    headers += [("Impersonate-Group", group) for group in groups]
    headers += [
        (f"Impersonate-Extra-{header_key_escape(str(key))}", value) for key, values in extra.items() for value in values
    ]
    return tuple(headers)


def header_key_escape(key: str) -> str:
    """client-go's escape of an extra's key into a header name: every byte that is not an HTTP token
    character (a '/' in `example.com/team`), and '%' itself, as %XX; the API server unescapes it. `quote`
    keeps letters, digits and `_.-~`; the rest of the token characters are named safe."""
    return quote(key, safe="!#$&'*+^`|")


def _stderr_tail(stderr: bytes) -> str:
    """The end of what the plugin printed on stderr, as one printable line (no colour codes, no NULs)."""
    decoded = stderr.decode("utf-8", errors="replace").replace("\x1b", " ")
    text = one_line("".join(char if char.isprintable() or char.isspace() else " " for char in decoded))
    if not text:
        return ""
    return f": {text[-STDERR_TAIL_CHARS:]}" if len(text) <= STDERR_TAIL_CHARS else f": ...{text[-STDERR_TAIL_CHARS:]}"
