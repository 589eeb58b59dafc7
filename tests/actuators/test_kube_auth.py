"""The exec plugin and oidc authentication (`sidecar.actuators.kube_auth`) and what kubeconfig_credentials
builds from a kubeconfig, without an API server: real plugin processes, the API server and identity provider
played by httpx's MockTransport, which records what it is sent. The real API server accepts what these
produce in tests/actuators/test_kubernetes_apiserver.py.
"""

# ruff: noqa: S105, S106, S107 - the tokens, refresh-tokens and client secrets here are fixtures

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from sidecar.actuators import kube_auth
from sidecar.actuators.kube_auth import ExecCredentialAuth, ExecPlugin, header_key_escape
from sidecar.actuators.kube_client import KubeClient, KubeTransportError
from sidecar.actuators.kube_credentials import CredentialsError, KubeCredentials, kubeconfig_credentials
from sidecar.actuators.kube_oidc import OidcAuth, OidcProvider, jwt_expiry
from tests.security.certs import issue, make_ca

from .test_kubernetes_unit import write_kubeconfig

V1, V1BETA1 = "client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"
NOW_S = 1_800_000_000.0


def jwt(claims: dict[str, Any]) -> str:
    """A JWT's shape (what the API server would verify; the client only reads `exp`)."""

    def part(document: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


class Recorder:
    """The API server: answers 200 to a request carrying `accepted`, else 401; keeps every request."""

    def __init__(self, accepted: str) -> None:
        self.accepted = accepted
        self.requests: list[httpx.Request] = []
        self.bearers: list[str] = []  # as sent: a retry sends the same request object with a new header

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bearers.append(request.headers.get("Authorization", "").removeprefix("Bearer "))
        ok = request.headers.get("Authorization") == f"Bearer {self.accepted}"
        return httpx.Response(200, json={"kind": "Pod"}) if ok else httpx.Response(401, json={"kind": "Status"})


def client(auth: httpx.Auth, recorder: Recorder, *, timeout_s: float = 5, **fields: Any) -> KubeClient:
    config = KubeConfig.from_one(cluster=Cluster(server="https://k8s.example"), user=User()).get()
    assert config is not None
    credentials = KubeCredentials(config=config, source="kubeconfig k (context c)", auth=auth, **fields)
    return KubeClient(credentials, timeout_s=timeout_s, transport=httpx.MockTransport(recorder))


def plugin_script(folder: Path, body: str) -> Path:
    """An exec plugin: a shell script that notes each run (and its KUBERNETES_EXEC_INFO), then runs `body`."""
    script = folder / "plugin"
    script.write_text(f'#!/bin/sh\necho "$KUBERNETES_EXEC_INFO" >> "{folder}/runs"\n{body}\n')
    script.chmod(0o755)
    return script


def credential(api_version: str, token: str, expires: str | None = None) -> str:
    status: dict[str, Any] = {"token": token}
    if expires:
        status["expirationTimestamp"] = expires
    return (
        "cat <<'EOF'\n" + json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "status": status}) + "\nEOF"
    )


def runs(folder: Path) -> list[dict[str, Any]]:
    path = folder / "runs"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- exec plugins ---------------------------------------------------------------------------------------


async def test_a_v1_plugin_gets_exec_info_and_its_token_is_kept_until_it_expires(tmp_path: Path) -> None:
    """kubectl's protocol: KUBERNETES_EXEC_INFO says the version and that no terminal is there (and the
    cluster when asked); the token serves until 10 s before its expirationTimestamp, then the plugin runs again."""
    now = [NOW_S]
    cluster = {"server": "https://k8s.example", "certificate-authority-data": "Q0E="}
    script = plugin_script(tmp_path, credential(V1, "tok", "2027-01-15T08:00:00Z"))
    auth = ExecCredentialAuth(
        ExecPlugin(api_version=V1, command=str(script), cluster=cluster), wall_clock=lambda: now[0]
    )
    recorder = Recorder("tok")
    kube = client(auth, recorder)
    expires_at = datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    now[0] = expires_at - 3600
    for _ in range(3):
        assert (await kube.request("GET", "/api/v1/namespaces")).status_code == 200
    assert len(runs(tmp_path)) == 1
    now[0] = expires_at - 5  # inside the 10 s margin
    assert (await kube.request("GET", "/api/v1/namespaces")).status_code == 200
    assert len(runs(tmp_path)) == 2
    info = runs(tmp_path)[0]
    assert info == {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False, "cluster": cluster}}
    assert recorder.bearers == ["tok"] * 4
    await kube.close()


async def test_a_401_on_a_kept_token_runs_the_plugin_again_and_retries_once(tmp_path: Path) -> None:
    current = tmp_path / "current"
    current.write_text("old")
    body = (
        f'printf \'{{"apiVersion": "{V1BETA1}", "kind": "ExecCredential", "status": {{"token": "%s"}}}}\' '
        f'"$(cat "{current}")"'
    )
    auth = ExecCredentialAuth(ExecPlugin(api_version=V1BETA1, command=str(plugin_script(tmp_path, body))))
    recorder = Recorder("new")
    kube = client(auth, recorder)
    assert (await kube.request("GET", "/x")).status_code == 401  # a fresh token refused: no second run
    assert len(runs(tmp_path)) == 1
    current.write_text("new")
    assert (await kube.request("GET", "/x")).status_code == 200  # kept "old" refused: run again, retry
    assert len(runs(tmp_path)) == 2
    assert recorder.bearers == ["old", "old", "new"]
    assert runs(tmp_path)[0] == {"apiVersion": V1BETA1, "kind": "ExecCredential", "spec": {"interactive": False}}
    await kube.close()


async def test_concurrent_requests_run_the_plugin_once(tmp_path: Path) -> None:
    script = plugin_script(tmp_path, "sleep 0.2\n" + credential(V1, "tok"))
    kube = client(ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(script))), Recorder("tok"))
    answers = await asyncio.gather(*(kube.request("GET", "/x") for _ in range(4)))
    assert [answer.status_code for answer in answers] == [200] * 4
    assert len(runs(tmp_path)) == 1
    await kube.close()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo 'token expired, run aws sso login' >&2; exit 3", "exited with 3: token expired, run aws sso login"),
        ("echo not-json", "did not print an ExecCredential (not JSON)"),
        (credential(V1BETA1, "t"), f"answered apiVersion {V1BETA1}, the kubeconfig asks for {V1}"),
        (credential(V1, ""), "answered no status.token and no client certificate"),
        (
            "echo '"
            + json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {"clientCertificateData": "x"}})
            + "'",
            "answered a client certificate without its key, or a key without one",
        ),
        (
            "echo '"
            + json.dumps(
                {
                    "apiVersion": V1,
                    "kind": "ExecCredential",
                    "status": {"clientCertificateData": "x", "clientKeyData": "y"},
                }
            )
            + "'",
            "answered a client certificate that cannot be loaded: [SSL] PEM lib",
        ),
        (credential(V1, "t", "tomorrow"), "answered expirationTimestamp 'tomorrow', not RFC 3339"),
        ("exec yes", "printed over 1048576 bytes"),  # endless: read up to the cap, then killed
        ("head -c 3000000 /dev/zero >&2; echo login needed >&2; exit 1", "exited with 1: login needed"),
    ],
)
async def test_a_plugin_that_gives_no_token_fails_the_request_in_one_line_unsent(
    tmp_path: Path, body: str, expected: str
) -> None:
    script = plugin_script(tmp_path, body)
    recorder = Recorder("t")
    kube = client(ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(script))), recorder)
    with pytest.raises(KubeTransportError) as caught:
        await kube.request("GET", "/x")
    # startswith: OpenSSL's own words end with its source line, "(_ssl.c:NNNN)"
    assert str(caught.value).startswith(
        f"GET /x: no credentials from kubeconfig k (context c): exec plugin {str(script)!r} {expected}"
    )
    assert "\n" not in str(caught.value)
    assert recorder.requests == []
    await kube.close()


async def test_a_plugin_still_running_at_the_deadline_is_killed(tmp_path: Path) -> None:
    """A plugin waiting on a login that never comes must not outlive the request that started it, nor must
    what it started."""
    pid_file, child_file = tmp_path / "pid", tmp_path / "child"
    script = plugin_script(tmp_path, f'echo $$ > "{pid_file}"\nsleep 3600 &\necho $! > "{child_file}"\nwait')
    config = KubeConfig.from_one(cluster=Cluster(server="https://k8s.example"), user=User()).get()
    assert config is not None
    auth = ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(script)))
    credentials = KubeCredentials(config=config, source="kubeconfig k (context c)", auth=auth)
    kube = KubeClient(credentials, timeout_s=0.5, transport=httpx.MockTransport(Recorder("t")))
    # Bounded far above the deadline: a child holding the plugin's pipes once kept asyncio waiting for them.
    async with asyncio.timeout(30):
        with pytest.raises(KubeTransportError, match=re.escape("no answer from https://k8s.example within 0.5 s")):
            await kube.request("GET", "/x")
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)
    assert not _running(int(child_file.read_text()))
    await kube.close()


def _running(pid: int) -> bool:
    """Alive, not a zombie (an orphan waits for whoever adopted it to reap it: pid 1 in a container may not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_plugin_killed_at_the_output_cap_leaves_nothing_open_for_the_garbage_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper script's child once held the pipes open: the request waited for its deadline, the child ran on,
    and the subprocess's transport, still open when the event loop ended, raised 'Event loop is closed' when
    collected, in whichever test was running then. The plugin's whole process group is killed now, and its
    pipes are closed as it ends."""
    # The deadline is not what this test is about: generous. (Runs that read the deadline's error here, at 5 s and
    # at 120 s, met a paused stdout pipe; the test after this one pins that.)
    kube = client(
        ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(plugin_script(tmp_path, "yes")))),
        Recorder("t"),
        timeout_s=120,
    )
    raised: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: raised.append(unraisable.exc_value))
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KubeTransportError, match="printed over 1048576 bytes"):
            loop.run_until_complete(kube.request("GET", "/x"))
        loop.run_until_complete(kube.close())
    finally:
        loop.close()  # at once, with no further turn that could have closed the pipes
    gc.collect()
    assert raised == []


async def test_a_plugin_stopped_at_the_output_cap_fails_at_once_though_its_pipe_was_paused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader slow to stop at the cap lets the plugin fill the pipe's buffer, and asyncio pauses that pipe: it
    never sees its end, and the process's wait() waits for every pipe's end. The request must fail at the cap,
    not wait out its deadline (CI once read the deadline's error here)."""
    real = kube_auth._read_up_to

    async def slow_to_stop(stream: asyncio.StreamReader, limit: int, process: asyncio.subprocess.Process) -> bytes:
        read = b""
        while chunk := await stream.read(65536):
            read += chunk
            if len(read) > limit:
                await asyncio.sleep(0.2)  # the plugin writes on meanwhile: the buffer fills and reading pauses
                return read + await real(stream, 0, process)  # the cap's own end: kill, stop reading
        return read

    monkeypatch.setattr(kube_auth, "_read_up_to", slow_to_stop)
    kube = client(
        ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(plugin_script(tmp_path, "yes")))),
        Recorder("t"),
        timeout_s=10,
    )
    with pytest.raises(KubeTransportError, match="printed over 1048576 bytes"):
        await kube.request("GET", "/x")
    await kube.close()


@pytest.mark.parametrize("loadable", [True, False])
async def test_a_plugins_client_certificate_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loadable: bool
) -> None:
    """OpenSSL loads a certificate and key only from files: they are written to private temporary files and
    gone once loaded, or once loading failed, not at the sidecar's exit."""
    pair = issue(make_ca(tmp_path / "ca"), tmp_path / "leaf", "sidecar")
    certificate, key = pair.cert.read_text(), pair.key.read_text() if loadable else "not a key"
    status = {"clientCertificateData": certificate, "clientKeyData": key}
    answer = {"apiVersion": V1, "kind": "ExecCredential", "status": status}
    (tmp_path / "answer.json").write_text(json.dumps(answer))
    script = plugin_script(tmp_path, f'cat "{tmp_path}/answer.json"')
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    recorder = Recorder("t")
    kube = client(ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(script))), recorder)
    if loadable:
        await kube.request("GET", "/x")
        assert "Authorization" not in recorder.requests[0].headers  # the certificate is in the handshake
    else:
        with pytest.raises(KubeTransportError, match="answered a client certificate that cannot be loaded"):
            await kube.request("GET", "/x")
    assert list(temporary.iterdir()) == []
    await kube.close()


# --- oidc -----------------------------------------------------------------------------------------------

ISSUER = "https://idp.example/realms/ml"


class IdentityProvider:
    """Discovery and a token endpoint that takes the one refresh-token it last gave (and rotates it)."""

    def __init__(self, *, refresh_token: str, id_token: str, secret: str | None = "s3cret") -> None:
        self.refresh_token = refresh_token
        self.id_token = id_token
        self.secret = secret
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url == f"{ISSUER}/.well-known/openid-configuration":
            return httpx.Response(200, json={"issuer": ISSUER, "token_endpoint": f"{ISSUER}/token"})
        assert request.url == f"{ISSUER}/token"
        assert request.method == "POST"
        form = dict(httpx.QueryParams(request.content.decode()))
        if self.secret is not None:
            basic = base64.b64encode(f"kube%3Aclient:{self.secret}".encode()).decode()
            assert request.headers["Authorization"] == f"Basic {basic}"  # form-encoded, then Basic (RFC 6749)
        else:
            assert form.pop("client_id") == "kube:client"
        if form != {"grant_type": "refresh_token", "refresh_token": self.refresh_token}:
            return httpx.Response(400, json={"error": "invalid_grant", "error_description": "Token is not active"})
        self.refresh_token += "+"
        return httpx.Response(200, json={"id_token": self.id_token, "refresh_token": self.refresh_token})


def oidc_client(provider: OidcProvider, idp: IdentityProvider, recorder: Recorder, now: list[float]) -> KubeClient:
    auth = OidcAuth(provider, wall_clock=lambda: now[0], transport=httpx.MockTransport(idp))
    return client(auth, recorder)


async def test_oidc_uses_the_id_token_until_it_expires_then_refreshes_it() -> None:
    now = [NOW_S]
    first, second = jwt({"sub": "a", "exp": NOW_S + 600}), jwt({"sub": "a", "exp": NOW_S + 4200})
    idp = IdentityProvider(refresh_token="r0", id_token=second)
    provider = OidcProvider(
        issuer_url=ISSUER + "/", client_id="kube:client", client_secret="s3cret", id_token=first, refresh_token="r0"
    )
    recorder = Recorder(first)
    kube = oidc_client(provider, idp, recorder, now)
    assert (await kube.request("GET", "/x")).status_code == 200
    assert idp.requests == []  # still valid: no call to the identity provider
    now[0] = NOW_S + 595  # 5 s left, inside client-go's 10 s margin
    recorder.accepted = second
    assert (await kube.request("GET", "/x")).status_code == 200
    assert [request.url.path for request in idp.requests] == [
        "/realms/ml/.well-known/openid-configuration",
        "/realms/ml/token",
    ]
    assert recorder.bearers == [first, second]
    now[0] = NOW_S + 4195
    idp.id_token = third = jwt({"sub": "a", "exp": NOW_S + 8000})
    recorder.accepted = third
    assert (await kube.request("GET", "/x")).status_code == 200  # with the rotated refresh-token "r0+"
    assert idp.refresh_token == "r0++"
    await kube.close()


async def test_oidc_without_an_id_token_gets_one_for_a_public_client() -> None:
    token = jwt({"exp": NOW_S + 600})
    idp = IdentityProvider(refresh_token="r0", id_token=token, secret=None)
    provider = OidcProvider(issuer_url=ISSUER, client_id="kube:client", refresh_token="r0")
    kube = oidc_client(provider, idp, Recorder(token), [NOW_S])
    assert (await kube.request("GET", "/x")).status_code == 200
    await kube.close()


@pytest.mark.parametrize(
    ("provider", "answer", "expected"),
    [
        (
            OidcProvider(issuer_url=ISSUER, client_id="kube:client", id_token=jwt({"exp": NOW_S - 1})),
            None,
            "the oidc id-token has expired and the auth-provider config has no refresh-token to refresh it (log in "
            "again, or use an exec plugin such as kubelogin)",
        ),
        (
            OidcProvider(issuer_url=ISSUER, client_id="kube:client", client_secret="s3cret", refresh_token="stale"),
            None,
            f"the oidc issuer's {ISSUER}/token answered HTTP 400: invalid_grant (Token is not active)",
        ),
        (
            OidcProvider(issuer_url=ISSUER, client_id="kube:client", client_secret="s3cret", refresh_token="r0"),
            httpx.Response(200, json={"access_token": "a"}),
            f"the oidc issuer {ISSUER} answered the refresh without an id_token",
        ),
        (
            OidcProvider(issuer_url=ISSUER, client_id="kube:client", client_secret="s3cret", refresh_token="r0"),
            httpx.Response(200, text="<html>login</html>"),
            f"the oidc issuer's {ISSUER}/token answered HTTP 200 without a JSON object",
        ),
        (
            OidcProvider(issuer_url=ISSUER, client_id="kube:client", client_secret="s3cret", refresh_token="r0"),
            httpx.Response(200, content=b"{" * (2 * 2**20)),
            f"the oidc issuer's {ISSUER}/token answered over 1048576 bytes",
        ),
    ],
)
async def test_oidc_that_cannot_refresh_fails_the_request_in_one_line_unsent(
    provider: OidcProvider, answer: httpx.Response | None, expected: str
) -> None:
    idp = IdentityProvider(refresh_token="r0", id_token=jwt({"exp": NOW_S + 600}))

    def token_endpoint(request: httpx.Request) -> httpx.Response:
        if answer is not None and request.url.path.endswith("/token"):
            return answer
        return idp(request)

    recorder = Recorder("t")
    auth = OidcAuth(provider, wall_clock=lambda: NOW_S, transport=httpx.MockTransport(token_endpoint))
    kube = client(auth, recorder)
    with pytest.raises(KubeTransportError) as caught:
        await kube.request("GET", "/x")
    assert str(caught.value) == f"GET /x: no credentials from kubeconfig k (context c): {expected}"
    assert recorder.requests == []
    await kube.close()


def test_jwt_expiry_reads_exp_and_nothing_else() -> None:
    assert jwt_expiry(jwt({"exp": 1700000000})) == 1700000000.0
    assert jwt_expiry(jwt({"exp": "soon"})) is None
    assert jwt_expiry(jwt({"exp": True})) is None
    assert jwt_expiry("opaque-token") is None
    assert jwt_expiry("a.!!!.c") is None


# --- impersonation and tls-server-name on the wire ----------------------------------------------------------


async def test_impersonation_headers_and_the_tls_server_name_go_on_every_request(tmp_path: Path) -> None:
    recorder = Recorder("tok")
    script = plugin_script(tmp_path, credential(V1, "tok"))
    headers = (("Impersonate-User", "jane"), ("Impersonate-Group", "a"), ("Impersonate-Group", "b"))
    kube = client(
        ExecCredentialAuth(ExecPlugin(api_version=V1, command=str(script))),
        recorder,
        impersonation=headers,
        tls_server_name="kubernetes.default.svc",
    )
    await kube.request("GET", "/x")
    (request,) = recorder.requests
    assert request.headers.get_list("Impersonate-Group") == ["a", "b"]
    assert request.headers["Impersonate-User"] == "jane"
    assert request.extensions["sni_hostname"] == "kubernetes.default.svc"
    await kube.close()


def test_extra_keys_are_escaped_as_client_go_escapes_them() -> None:
    assert header_key_escape("scopes") == "scopes"
    assert header_key_escape("example.com/team") == "example.com%2Fteam"
    assert header_key_escape("100%") == "100%25"
    assert header_key_escape("a b:c") == "a%20b%3Ac"
    assert header_key_escape("équipe~v1") == "%C3%A9quipe~v1"  # UTF-8 bytes escaped; '~' is a token character
    assert header_key_escape("!#$&'*+-.^_`|~") == "!#$&'*+-.^_`|~"


# --- what kubeconfig_credentials builds --------------------------------------------------------------------


async def test_provide_cluster_info_gives_the_plugin_the_cluster_with_its_ca(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("PEM")
    plugin_script(tmp_path, credential(V1, "tok"))
    cluster = {
        "server": "https://k8s.example:6443",
        "certificate-authority": "ca.crt",
        "tls-server-name": "api.internal",
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "sts"}}],
    }
    user = {"exec": {"apiVersion": V1, "command": "./plugin", "interactiveMode": "Never", "provideClusterInfo": True}}
    credentials = kubeconfig_credentials(write_kubeconfig(tmp_path, user, cluster))
    assert credentials.tls_server_name == "api.internal"
    assert isinstance(credentials.auth, ExecCredentialAuth)
    assert credentials.auth.exec_info()["spec"] == {
        "interactive": False,
        "cluster": {
            "server": "https://k8s.example:6443",
            "certificate-authority-data": base64.b64encode(b"PEM").decode(),
            "tls-server-name": "api.internal",
            "config": {"audience": "sts"},
        },
    }


def test_every_exec_version_kubectl_runs_is_accepted(tmp_path: Path) -> None:
    for version in (V1, V1BETA1, "client.authentication.k8s.io/v1alpha1"):
        user = {"exec": {"apiVersion": version, "command": "sh", "interactiveMode": "IfAvailable"}}
        assert isinstance(kubeconfig_credentials(write_kubeconfig(tmp_path, user)).auth, ExecCredentialAuth)


def test_oidc_and_impersonation_are_read_from_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "idp.crt").write_text("IDP PEM")
    user = {
        "auth-provider": {
            "name": "oidc",
            "config": {
                "idp-issuer-url": ISSUER,
                "client-id": "kube",
                "refresh-token": "r0",
                "idp-certificate-authority": "idp.crt",
            },
        },
        "as": "system:serviceaccount:ml:vllm-sidecar",
        "as-groups": ["ops"],
        "as-user-extra": {"example.com/team": ["ml", "infra"]},
    }
    credentials = kubeconfig_credentials(write_kubeconfig(tmp_path, user))
    assert isinstance(credentials.auth, OidcAuth)
    assert credentials.impersonation == (
        ("Impersonate-User", "system:serviceaccount:ml:vllm-sidecar"),
        ("Impersonate-Group", "ops"),
        ("Impersonate-Extra-example.com%2Fteam", "ml"),
        ("Impersonate-Extra-example.com%2Fteam", "infra"),
    )


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (
            {"exec": {"apiVersion": "client.authentication.k8s.io/v2", "command": "sh"}},
            "exec plugin 'sh' is set to apiVersion client.authentication.k8s.io/v2; kubectl and the sidecar run "
            "client.authentication.k8s.io/v1, ",
        ),
        (
            {"exec": {"apiVersion": V1, "command": "sh", "interactiveMode": "Always"}},
            "exec plugin 'sh' has interactiveMode Always, and a daemon has no terminal to prompt on",
        ),
        ({"auth-provider": {"name": "gcp"}}, "'gcp' auth-provider, .*kubectl 1.26 removed it; use the gke-gcloud"),
        ({"auth-provider": {"name": "azure"}}, "'azure' auth-provider, .*use the kubelogin exec plugin"),
        ({"auth-provider": {"name": "x"}}, "'x' auth-provider, .*kubectl builds in only oidc"),
        (
            {"auth-provider": {"name": "oidc", "config": {"client-id": "kube", "refresh-token": "r"}}},
            "the oidc auth-provider has no id-token, and no refresh-token, idp-issuer-url and client-id to get one",
        ),
        (
            {"auth-provider": {"name": "oidc", "config": {"id-token": "t", "idp-certificate-authority-data": "%%"}}},
            "oidc idp-certificate-authority-data is not base64 PEM",
        ),
        ({"token": "t", "as-groups": ["ops"]}, "as-uid, as-groups or as-user-extra is set without as"),
        ({"token": "t", "as": "jane", "as-groups": "ops"}, "as-groups is not a list of names"),
    ],
)
def test_what_kubectl_would_not_run_here_is_refused_at_start_in_one_line(
    tmp_path: Path, user: dict[str, Any], expected: str
) -> None:
    with pytest.raises(CredentialsError, match=expected) as caught:
        kubeconfig_credentials(write_kubeconfig(tmp_path, user))
    assert str(caught.value).startswith(f"kubeconfig {tmp_path / 'kubeconfig'} (context prod): ")
    assert "\n" not in str(caught.value)
