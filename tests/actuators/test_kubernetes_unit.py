"""The Kubernetes adapter without an API server: names, bodies, the shipped Role, credentials, and failures a
real server does not easily produce (refused connections, timeouts, 5xx, odd answers), on loopback servers.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sidecar.actuators import kube_bodies
from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.kube_auth import ExecCredentialAuth, ExecPlugin
from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_credentials import (
    CredentialsError,
    in_cluster_credentials,
    kubeconfig_credentials,
    own_pod,
)
from sidecar.actuators.kube_flags import PERMISSIONS as FLAGS_PERMISSIONS
from sidecar.actuators.kube_logs import LOG_PERMISSIONS
from sidecar.actuators.kube_names import KubeNameError, event_name
from sidecar.actuators.kubernetes import (
    EVENT_PERMISSIONS,
    PERMISSIONS,
    SUPERVISION_PERMISSIONS,
    KubernetesActuator,
    KubernetesEvents,
)
from tests.loopback import Behaviour, LoopbackServer, closed_port, respond, slow

from .kube_apiserver import RBAC_FILE, REMEDIATION_RBAC_FILE, rbac_documents, token_credentials

POD_PATH = "/api/v1/namespaces/ml/pods/vllm-0"


def client_for(url: str, *, timeout_s: float = 2.0) -> KubeClient:
    return KubeClient(token_credentials(url, "t", source="test"), timeout_s=timeout_s)


def status(code: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> Behaviour:
    body: dict[str, Any] = {"kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code}
    if causes:
        body["details"] = {"causes": [{"reason": cause} for cause in causes]}
    return respond(code, json.dumps(body).encode(), "application/json")


def document(body: dict[str, Any]) -> Behaviour:
    return respond(200, json.dumps(body).encode(), "application/json")


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    served = LoopbackServer()
    yield served
    served.close()


# --- names: nothing can address another resource -------------------------------------------------------

BAD_NAMES = ["", "../secrets", "a/b", "Vllm", "vllm?x=1", "vllm%2F", "vllm ", "-vllm", "vllm-", "a" * 254, "vllm\n"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_pod_names_are_refused_at_construction(name: str) -> None:
    with pytest.raises(KubeNameError, match="pod name"):
        KubernetesActuator("evict", pod=name, namespace="ml", client=client_for("http://127.0.0.1:1"))
    with pytest.raises(KubeNameError, match="pod name"):
        KubernetesEvents(client_for("http://127.0.0.1:1"), pod=name, namespace="ml")


@pytest.mark.parametrize("namespace", ["", "a.b", "ML", "a" * 64, "../kube-system", "kube system"])
def test_bad_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(KubeNameError, match="namespace"):
        KubernetesActuator("delete", pod="vllm-0", namespace=namespace, client=client_for("http://127.0.0.1:1"))


def test_bad_mode_and_grace_period_are_refused() -> None:
    with pytest.raises(ValueError, match="'restart' is not one of evict, delete, rollout"):
        KubernetesActuator("restart", pod="vllm-0", namespace="ml", client=client_for("http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="negative"):
        KubernetesActuator("delete", pod="v", namespace="ml", client=client_for("http://x"), grace_period_s=-1)


def test_event_names_stay_valid_subdomains() -> None:
    assert event_name("vllm-0", 0x17A2B3C4D5E6F7A8) == "vllm-0.17a2b3c4d5e6f7a8"
    long_name = "a" * 200 + "." + "b" * 52
    name = event_name(long_name, 2**63 - 1)
    assert len(name) <= 253
    assert name.endswith(".7fffffffffffffff")


# --- bodies and the Role, checked against the Kubernetes schemas ----------------------------------------


def test_rbac_yaml_grants_exactly_what_the_adapter_uses() -> None:
    documents = [doc for doc in yaml.safe_load_all(RBAC_FILE.read_text()) if doc]
    assert [doc["kind"] for doc in documents] == ["ServiceAccount", "Role", "RoleBinding"]
    (role,) = (doc for doc in documents if doc["kind"] == "Role")
    granted = {
        (verb, resource, group)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for resource in rule["resources"]
        for group in rule["apiGroups"]
    }
    used = {(p.verb, p.resource, p.group) for needed in PERMISSIONS.values() for p in needed}
    used |= {(p.verb, p.resource, p.group) for p in EVENT_PERMISSIONS}
    used |= {(p.verb, p.resource, p.group) for p in LOG_PERMISSIONS}
    used |= {(p.verb, p.resource, p.group) for p in SUPERVISION_PERMISSIONS}
    assert granted == used
    assert all("resourceNames" not in rule for rule in role["rules"])
    (binding,) = (doc for doc in documents if doc["kind"] == "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vllm-sidecar"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vllm-sidecar"}]


def test_manifest_and_bodies_pass_the_kubernetes_schemas() -> None:
    validator = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate to check schemas")
    version = "1.37.0"
    for manifest in yaml.safe_load_all(RBAC_FILE.read_text()):
        validator.validate(manifest, version, strict=True)
    validator.validate(kube_bodies.eviction("vllm-0", "ml", grace_period_s=30), version, strict=True)
    event = kube_bodies.event(
        pod="vllm-0", namespace="ml", pod_uid="u", reason="RestartStarted", message="m", warning=True, wall_time_ns=1
    )
    validator.validate(event, version, strict=True)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "v", "image": "i"}]},
            },
        },
    }
    patch = kube_bodies.restart_patch(0)  # the patch is partial: check the object it makes
    deployment["spec"]["template"]["metadata"].update(patch["spec"]["template"]["metadata"])  # type: ignore[index]
    validator.validate(deployment, version, strict=True)
    for manifest in rbac_documents(REMEDIATION_RBAC_FILE):
        validator.validate(manifest, version, strict=True)
    flags = kube_bodies.flags_patch(
        resource_version="42", annotations={"vllm-sidecar.io/flags": "[]"}, container="v", args=["--port", "8000"]
    )
    deployment["metadata"].update(flags["metadata"])  # type: ignore[attr-defined]
    deployment["spec"]["template"]["spec"]["containers"][0].update(  # type: ignore[index]
        flags["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    )
    validator.validate(deployment, version, strict=True)


def test_the_remediation_role_grants_exactly_what_the_flags_target_uses() -> None:
    documents = rbac_documents(REMEDIATION_RBAC_FILE)
    assert [doc["kind"] for doc in documents] == ["Role", "RoleBinding"]
    (role,) = (doc for doc in documents if doc["kind"] == "Role")
    granted = {
        (verb, resource, group)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for resource in rule["resources"]
        for group in rule["apiGroups"]
    }
    assert granted == {(p.verb, p.resource, p.group) for p in FLAGS_PERMISSIONS}
    assert all("resourceNames" not in rule for rule in role["rules"])
    (binding,) = (doc for doc in documents if doc["kind"] == "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    # The same ServiceAccount as add-sidecar's, which brings it.
    (sidecar_binding,) = (doc for doc in rbac_documents(RBAC_FILE) if doc["kind"] == "RoleBinding")
    assert binding["subjects"] == sidecar_binding["subjects"]


def test_event_body_truncates_and_stamps() -> None:
    body = kube_bodies.event(
        pod="vllm-0", namespace="ml", pod_uid=None, reason="R", message="é" * 2000, warning=False, wall_time_ns=10**18
    )
    assert len(str(body["message"])) == 1024
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2001-09-09T01:46:40Z"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "vllm-0", "namespace": "ml"}


# --- credentials ----------------------------------------------------------------------------------------


def write_kubeconfig(folder: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    config = {
        "current-context": "prod",
        "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://k8s.example:6443/"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_kubeconfig_gives_server_source_and_namespace(tmp_path: Path) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cluster = {
        "server": "https://k8s.example:6443/",
        "certificate-authority-data": base64.b64encode(ca.encode()).decode(),
        "proxy-url": "http://proxy.example:3128",
    }
    credentials = kubeconfig_credentials(write_kubeconfig(tmp_path, {"token": "abc"}, cluster))
    assert (credentials.server, credentials.namespace) == ("https://k8s.example:6443", "ml")
    assert credentials.proxy_url == "http://proxy.example:3128"
    assert credentials.source == f"kubeconfig {tmp_path / 'kubeconfig'} (context prod)"


def test_kubeconfig_files_are_relative_to_it_and_read_with_a_cap_at_start(tmp_path: Path) -> None:
    """lightkube reads a tokenFile (and OpenSSL the CA and client files) only at the first request: a missing
    or oversized one is said at start, in one line, naming the kubeconfig and the file."""
    (tmp_path / "token").write_text("from-file\n")
    credentials = kubeconfig_credentials(write_kubeconfig(tmp_path, {"tokenFile": "token"}))
    assert credentials.config.user is not None
    assert credentials.config.user.token_file == str(tmp_path / "token")  # lightkube alone would open ./token
    (tmp_path / "token").write_bytes(b"x" * (64 * 2**10 + 1))
    with pytest.raises(CredentialsError, match=r"cannot read the tokenFile of kubeconfig .* over the 65536 byte limit"):
        kubeconfig_credentials(tmp_path / "kubeconfig")
    for key in ("client-certificate", "client-key"):
        path = write_kubeconfig(tmp_path, {"client-certificate": "c.crt", "client-key": "c.key"})
        (tmp_path / "c.crt").write_text("x")
        (tmp_path / "c.key").write_text("x")
        (tmp_path / ("c.crt" if key == "client-certificate" else "c.key")).unlink()
        with pytest.raises(CredentialsError, match=f"cannot read the {key} of kubeconfig .*: No such file"):
            kubeconfig_credentials(path)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (
            {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": "no-such-auth-plugin",
                    "installHint": "Install gke-gcloud-auth-plugin for use with kubectl by following\n  https://x",
                }
            },
            "exec plugin 'no-such-auth-plugin' is not found or not executable: Install gke-gcloud-auth-plugin "
            "for use with kubectl by following https://x",
        ),
    ],
)
def test_a_plugin_that_is_not_installed_is_refused_in_one_line_with_its_hint(
    tmp_path: Path, user: dict[str, Any], expected: str
) -> None:
    with pytest.raises(CredentialsError, match=expected) as caught:
        kubeconfig_credentials(write_kubeconfig(tmp_path, user))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "sh", "args": ["get-token"]}},
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh", "interactiveMode": "Never"}},
        {"auth-provider": {"name": "oidc", "config": {"id-token": "t"}}},
        {"username": "a", "password": "b"},
        {"token": "t"},
    ],
)
def test_users_the_sidecar_authenticates_as_are_accepted(tmp_path: Path, user: dict[str, Any]) -> None:
    credentials = kubeconfig_credentials(write_kubeconfig(tmp_path, user))
    assert credentials.config.user is not None


def test_kubeconfig_errors_are_one_line(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path, {"token": "t"})
    with pytest.raises(CredentialsError, match="Context 'staging' not found"):
        kubeconfig_credentials(path, context="staging")
    path.write_text("clusters: [")
    with pytest.raises(CredentialsError, match="is not YAML") as error:
        kubeconfig_credentials(path)
    assert "\n" not in str(error.value)
    path.write_text(yaml.safe_dump({"current-context": "a", "contexts": [{"name": "a", "context": {"cluster": "b"}}]}))
    with pytest.raises(CredentialsError, match="no entry named 'clusters'"):
        kubeconfig_credentials(path)
    with pytest.raises(CredentialsError, match="cannot read kubeconfig"):
        kubeconfig_credentials(tmp_path / "missing")


def test_in_cluster_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in (("token", "tok"), ("ca.crt", "CA"), ("namespace", "ml\n")):
        (tmp_path / name).write_text(text)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # lightkube reads the daemon's environment
    credentials = in_cluster_credentials(env, tmp_path)
    assert (credentials.server, credentials.namespace, credentials.source) == (
        "https://[fd00::1]:443",
        "ml",
        "in-cluster",
    )
    assert credentials.config.user is not None
    assert credentials.config.user.token_file == str(tmp_path / "token")  # re-read by lightkube after a 401
    assert credentials.config.cluster.certificate_auth == str(tmp_path / "ca.crt")
    with pytest.raises(CredentialsError, match="not running in a Kubernetes pod"):
        in_cluster_credentials({}, tmp_path)
    (tmp_path / "token").unlink()
    with pytest.raises(CredentialsError, match="automountServiceAccountToken"):
        in_cluster_credentials(env, tmp_path)


def test_own_pod_from_the_downward_api() -> None:
    pod = own_pod({"POD_NAME": "vllm-0", "POD_NAMESPACE": "ml"})
    assert (pod.name, pod.namespace) == ("vllm-0", "ml")
    assert own_pod({"POD_NAME": "vllm-0"}, namespace_fallback="sa-ns").namespace == "sa-ns"
    with pytest.raises(CredentialsError, match="POD_NAME is not set: set it from the downward API"):
        own_pod({"POD_NAMESPACE": "ml"})
    with pytest.raises(CredentialsError, match="POD_NAMESPACE is not set"):
        own_pod({"POD_NAME": "vllm-0"})
    with pytest.raises(CredentialsError, match="not a valid RFC 1123"):
        own_pod({"POD_NAME": "../x", "POD_NAMESPACE": "ml"})


# --- failures on the wire: one line, never raised -------------------------------------------------------


async def test_dry_run_sends_nothing() -> None:
    client = client_for(f"http://127.0.0.1:{closed_port()}")
    details = []
    for mode in ("evict", "delete", "rollout"):
        adapter = KubernetesActuator(mode, pod="vllm-0", namespace="ml", client=client, grace_period_s=20)
        outcome = await adapter.restart(reason="x", dry_run=True)
        assert outcome.status is OutcomeStatus.DRY_RUN
        details.append(outcome.detail)
    assert details == [
        "would evict pod vllm-0 in namespace ml (policy/v1 Eviction, grace period 20 s)",
        "would delete pod vllm-0 in namespace ml (grace period 20 s)",
        "would rollout-restart the Deployment that owns pod vllm-0 in namespace ml "
        "(new kubectl.kubernetes.io/restartedAt)",
    ]
    hard = KubernetesActuator("delete", pod="vllm-0", namespace="ml", client=client)
    said = await hard.restart(reason="x", dry_run=True, hard=True)
    assert said.detail == "would delete pod vllm-0 in namespace ml (grace period 1 s)"
    await client.close()


async def test_unreachable_api_server_fails_in_one_line() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    adapter = KubernetesActuator("evict", pod="vllm-0", namespace="ml", client=client_for(url))
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail.startswith(f"POST {POD_PATH}/eviction: cannot connect to {url}: ")
    assert "\n" not in outcome.detail
    await adapter.close()


async def test_a_hanging_api_server_times_out(server: LoopbackServer) -> None:
    server.routes[POD_PATH] = slow(3.0, respond(200))
    adapter = KubernetesActuator("delete", pod="vllm-0", namespace="ml", client=client_for(server.url, timeout_s=0.3))
    started = time.monotonic()
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert time.monotonic() - started < 2.0
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail == f"DELETE {POD_PATH}: no answer from {server.url} within 0.3 s"
    await adapter.close()


async def test_server_errors_and_throttling(server: LoopbackServer) -> None:
    server.routes[POD_PATH + "/eviction"] = status(500, "InternalError", "etcdserver:\nrequest timed out")
    adapter = KubernetesActuator("evict", pod="vllm-0", namespace="ml", client=client_for(server.url))
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail == (
        "create pods/eviction for pod vllm-0 in namespace ml: the API server answered HTTP 500: "
        "etcdserver: request timed out"
    )
    # API Priority and Fairness throttles with 429 too, with no DisruptionBudget cause: try later all the same
    server.routes[POD_PATH + "/eviction"] = status(429, "TooManyRequests", "Too many requests, please try again later.")
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.NOT_NOW
    assert outcome.detail.startswith("the API server is throttling (429: ")
    server.routes[POD_PATH + "/eviction"] = respond(502, b"<html>bad gateway</html>", "text/html")
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.detail.endswith("the API server answered HTTP 502: X")  # the loopback's reason phrase
    await adapter.close()


async def test_owner_names_from_the_server_are_validated_before_use(server: LoopbackServer) -> None:
    """A hostile or broken answer cannot steer the next request to another resource."""
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "../../secrets/x", "uid": "1", "controller": True}
    server.routes[POD_PATH] = document({"metadata": {"uid": "p", "ownerReferences": [owner]}})
    adapter = KubernetesActuator("rollout", pod="vllm-0", namespace="ml", client=client_for(server.url))
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert "ReplicaSet name '../../secrets/x' is not a valid RFC 1123 subdomain" in outcome.detail
    assert server.hits == [POD_PATH]
    server.routes[POD_PATH] = document(
        {"metadata": {"ownerReferences": [{**owner, "kind": "StatefulSet", "name": "db"}]}}
    )
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.detail == (
        "pod vllm-0 is controlled by StatefulSet db (apps/v1), not a ReplicaSet: "
        "rollout restarts only Deployments (use mode evict or delete)"
    )
    server.routes[POD_PATH] = respond(200, b"not json")
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.detail.startswith("pod vllm-0 has no controller")
    await adapter.close()


async def test_events_never_raise(server: LoopbackServer) -> None:
    unreachable = KubernetesEvents(client_for(f"http://127.0.0.1:{closed_port()}"), pod="vllm-0", namespace="ml")
    await unreachable.emit(reason="RestartStarted", message="m", warning=False)
    assert unreachable.last_error is not None
    assert unreachable.last_error.startswith("event RestartStarted not recorded: POST /api/v1/namespaces/ml/events: ")
    assert await unreachable.send(reason="not camel", message="m", warning=False) == (
        "event not camel not recorded: event reason 'not camel' is not CamelCase "
        "(an upper-case letter, then letters and digits, at most 128 characters)"
    )
    await unreachable.close()
    assert (await unreachable.send(reason="Closed", message="m", warning=False) or "").endswith("the client is closed")
    server.routes[POD_PATH] = document({"metadata": {"uid": "u-1"}})
    server.routes["/api/v1/namespaces/ml/events"] = status(422, "Invalid", "Event is invalid")
    sink = KubernetesEvents(client_for(server.url), pod="vllm-0", namespace="ml")
    await sink.emit(reason="AdmissionPaused", message="m", warning=False)
    assert sink.last_error == (
        "event AdmissionPaused not recorded: create events for event AdmissionPaused in namespace ml: "
        "the API server answered HTTP 422: Event is invalid"
    )
    await sink.emit(reason="AdmissionResumed", message="m", warning=False)
    assert server.hits.count(POD_PATH) == 1  # the uid is read once
    await sink.close()


async def test_credentials_lost_after_start_fail_in_one_line_and_send_nothing(tmp_path: Path) -> None:
    """A token file gone, an exec plugin gone, failing or answering no token: the authentication raises before
    anything is sent; the adapter reports one line naming the request and the source."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(answer)
    (tmp_path / "token").write_text("t")
    answer_no_token = tmp_path / "no-token.sh"
    beta = "client.authentication.k8s.io/v1beta1"
    answer_no_token.write_text(
        f'#!/bin/sh\necho \'{{"apiVersion": "{beta}", "kind": "ExecCredential", "status": {{}}}}\'\n'
    )
    answer_no_token.chmod(0o755)
    gone = str(tmp_path / "gone")
    cases: list[tuple[dict[str, Any], ExecPlugin | None, str]] = [
        ({"token_file": str(tmp_path / "token")}, None, f"ConfigError: Token file {tmp_path / 'token'} not found"),
        ({}, ExecPlugin(api_version=beta, command=gone), f"exec plugin {gone!r} cannot be started: No such file"),
        ({}, ExecPlugin(api_version=beta, command="sh", args=("-c", "echo no >&2; exit 3")), "exited with 3: no"),
        ({}, ExecPlugin(api_version=beta, command=str(answer_no_token)), "answered no status.token"),
    ]
    for fields, plugin, expected in cases:
        credentials = replace(
            token_credentials("https://k8s.example", source="kubeconfig k (context c)", **fields),
            auth=None if plugin is None else ExecCredentialAuth(plugin),
        )
        adapter = KubernetesActuator(
            "delete", pod="vllm-0", namespace="ml", client=KubeClient(credentials, transport=transport)
        )
        (tmp_path / "token").unlink(missing_ok=True)
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.FAILED
        assert outcome.detail.startswith(f"DELETE {POD_PATH}: no credentials from kubeconfig k (context c): "), (
            outcome.detail
        )
        assert expected in outcome.detail
        assert "\n" not in outcome.detail
        await adapter.close()
    assert sent == []


async def test_an_oversized_answer_is_cut_off_with_a_clear_error(server: LoopbackServer) -> None:
    server.routes[POD_PATH] = respond(200, b"x" * (9 * 2**20), "application/json")  # over the 8 MiB cap
    adapter = KubernetesActuator("delete", pod="vllm-0", namespace="ml", client=client_for(server.url))
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail.endswith("answer exceeds 8388608 bytes")
    await adapter.close()


def test_a_daemon_without_kubernetes_never_imports_lightkube() -> None:
    """lightkube and its generated models cost about 130 modules and 8 MB: only a daemon that talks to
    Kubernetes loads them (the import-linter contract holds the static imports; this, the lazy ones)."""
    script = (
        "import sys\n"
        "import sidecar.shell.daemon\n"
        "from sidecar.shell.acting_setup import build_acting_parts\n"
        "from sidecar.shell.settings import load_settings\n"
        "for flags in ({}, {'actuator': 'exec', 'exec_command': 'true'}):\n"
        "    build_acting_parts(load_settings(flags))\n"
        "print(sorted(name for name in sys.modules if 'kube' in name))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout == "['sidecar.actuators.kube_names']\n", result.stderr  # the settings' name check
