"""Authentication no Python kubeconfig loader does as a daemon needs: exec plugins as kubectl runs them, and
impersonation. I/O. The `oidc` auth-provider is `kube_oidc`.

lightkube authenticates a kubeconfig's token, `tokenFile`, client certificate and username/password. For the
other forms kubectl accepts, these do what client-go does; kubernetes_asyncio's and the official client's
loaders were weighed and not taken (docs/kubernetes-credentials.md, "Who carries what"):

- `ExecCredentialAuth`: the exec plugin (`aws eks get-token`, `gke-gcloud-auth-plugin`, `kubelogin`), in each
  ExecCredential version kubectl speaks (v1, v1beta1, v1alpha1). The plugin gets `KUBERNETES_EXEC_INFO`
  (non-interactive; the cluster when `provideClusterInfo` asks for it), its token or client certificate
  (`tsh kube credentials` answers one) is kept until its `expirationTimestamp` (or, without one, until a
  401), a plugin still running when the request's deadline passes is killed, and a failure is one line with
  the end of what the plugin printed on stderr. lightkube's own runner takes v1beta1/v1alpha1 only, passes
  no `KUBERNETES_EXEC_INFO` and takes no certificate; no loader kills a plugin at the deadline or caps its output.
- `impersonation_headers`: a kubeconfig user's `as`, which no Python loader reads.

The exec flow is async only (the sidecar's client is), and its failures are `CredentialPluginError`, which the
client reports as "no credentials from <kubeconfig>".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

import httpx

from sidecar.model.text import one_line

EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
    "client.authentication.k8s.io/v1alpha1",
)
_V1ALPHA1 = EXEC_API_VERSIONS[2]
MAX_PLUGIN_OUTPUT_BYTES = 2**20  # an ExecCredential is a token or a certificate: a few KiB
STDERR_KEPT_BYTES = 4096  # what a plugin says last on stderr is why it failed ("run aws sso login")
STDERR_TAIL_CHARS = 300
# client-go's oidc refreshes an id-token this long before it expires, so a request never carries one that
# expires on the way; the same margin is used for an exec plugin's expirationTimestamp (and by kube_oidc).
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
