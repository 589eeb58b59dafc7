"""The Kubernetes adapter against a real kube-apiserver 1.20.2 + etcd, with the RBAC of
deploy/kubernetes/add-sidecar/rbac.yaml.

The code under test authenticates as the `vllm-sidecar` ServiceAccount (a token minted with the
TokenRequest API), bound by the shipped Role; fixtures act as an admin. Each test gets a fresh namespace.
Without etcd or the apiserver binary these tests skip, except in CI (CI=true) where that is a failure (the
session's server: conftest.py).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_credentials import CredentialsError, kubeconfig_credentials
from sidecar.actuators.kube_logs import LOG_PERMISSIONS, PodLog
from sidecar.actuators.kubernetes import EVENT_PERMISSIONS, PERMISSIONS, KubernetesActuator, KubernetesEvents, connect
from sidecar.actuators.log_source import LogUnreadableError, Wanted
from sidecar.model.supervision import Restarter
from tests.adapters.daemon_process import SidecarProcess
from tests.scenarios.harness import SimProcess

from .kube_apiserver import (
    EXEC_TOKEN,
    EXEC_USER,
    IMPERSONATOR,
    IMPERSONATOR_TOKEN,
    OIDC_TOKEN,
    OIDC_USER,
    POD_SPEC,
    ApiServer,
    Workspace,
)
from .oidc_issuer import OidcIssuer

WALL_S = 1_795_000_000.0  # 2026-11-18T11:06:40Z
WALL_RFC3339 = "2026-11-18T11:06:40Z"


@pytest.fixture
def workspace(apiserver: ApiServer, admin: httpx.Client) -> Workspace:
    """A namespace with the shipped RBAC and a Deployment -> ReplicaSet -> Pod chain."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac()
    space.create_workload()
    return space


@pytest.fixture
async def client(workspace: Workspace) -> AsyncIterator[KubeClient]:
    kube = KubeClient(workspace.credentials(workspace.sidecar_token()), timeout_s=10)
    yield kube
    await kube.close()


def actuator(mode: str, space: Workspace, client: KubeClient, **options: Any) -> KubernetesActuator:
    return KubernetesActuator(
        mode, pod=space.pod, namespace=space.namespace, client=client, wall_clock=lambda: WALL_S, **options
    )


async def test_evict_removes_the_pod(workspace: Workspace, client: KubeClient) -> None:
    outcome = await actuator("evict", workspace, client).restart(reason="oom_forecast", dry_run=False)
    # 1.20 predates policy/v1 Eviction: it answers 400 to it and the adapter falls back to policy/v1beta1.
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert outcome.detail == (
        f"evicted pod {workspace.pod} in namespace {workspace.namespace} (policy/v1beta1 Eviction accepted)"
    )
    assert not workspace.pod_exists()


async def test_evict_under_a_disruption_budget_is_not_now(workspace: Workspace, client: KubeClient) -> None:
    workspace.create_pdb()
    workspace.set_pod_running()  # a Pending pod skips the budget check
    outcome = await actuator("evict", workspace, client).restart(reason="oom_forecast", dry_run=False)
    assert outcome.status is OutcomeStatus.NOT_NOW, outcome.detail
    assert outcome.detail.startswith("a PodDisruptionBudget does not allow this eviction now (")
    assert "\n" not in outcome.detail
    assert workspace.pod_exists()


async def test_delete_removes_the_pod(workspace: Workspace, client: KubeClient) -> None:
    outcome = await actuator("delete", workspace, client, grace_period_s=0).restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert outcome.detail == f"deleted pod {workspace.pod} in namespace {workspace.namespace}, grace period 0 s"
    assert not workspace.pod_exists()


async def test_rollout_restarts_the_owning_deployment(workspace: Workspace, client: KubeClient) -> None:
    before = workspace.deployment_document()
    outcome = await actuator("rollout", workspace, client).restart(reason="stalled", dry_run=False)
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    after = workspace.deployment_document()
    annotations = after["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"kubectl.kubernetes.io/restartedAt": WALL_RFC3339}
    assert (before["metadata"]["generation"], after["metadata"]["generation"]) == (1, 2)
    assert outcome.detail == (
        f"rollout restart of Deployment vllm in namespace {workspace.namespace} "
        f"(restartedAt {WALL_RFC3339}, generation 1 -> 2)"
    )
    assert workspace.pod_exists()  # the pods are the Deployment controller's business


async def test_dry_run_touches_nothing(workspace: Workspace, client: KubeClient) -> None:
    pod_version = workspace.get(f"/api/v1/namespaces/{{ns}}/pods/{workspace.pod}").json()["metadata"]
    deployment_version = workspace.deployment_document()["metadata"]
    for mode in ("evict", "delete", "rollout"):
        outcome = await actuator(mode, workspace, client).restart(reason="x", dry_run=True)
        assert outcome.status is OutcomeStatus.DRY_RUN
        assert outcome.detail.startswith("would ")
    pod_after = workspace.get(f"/api/v1/namespaces/{{ns}}/pods/{workspace.pod}").json()["metadata"]
    assert pod_after["resourceVersion"] == pod_version["resourceVersion"]
    assert workspace.deployment_document()["metadata"]["resourceVersion"] == deployment_version["resourceVersion"]


async def test_events_are_created_on_the_own_pod(workspace: Workspace, client: KubeClient) -> None:
    events = KubernetesEvents(client, pod=workspace.pod, namespace=workspace.namespace)
    await events.emit(reason="AdmissionPaused", message="KV cache usage 0.93 >= 0.90", warning=False)
    assert events.last_error is None
    await events.emit(reason="RestartFailed", message="x" * 5000, warning=True)
    assert events.last_error is None
    # What `kubectl describe pod` asks for: events whose involvedObject is this pod, by uid.
    selector = f"involvedObject.kind=Pod,involvedObject.name={workspace.pod},involvedObject.uid={workspace.uids['pod']}"
    found = workspace.admin.get(f"/api/v1/namespaces/{workspace.namespace}/events", params={"fieldSelector": selector})
    items = sorted(found.json()["items"], key=lambda item: item["reason"])
    assert [(item["reason"], item["type"]) for item in items] == [
        ("AdmissionPaused", "Normal"),
        ("RestartFailed", "Warning"),
    ]
    paused, failed = items
    assert paused["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": workspace.pod,
        "namespace": workspace.namespace,
        "uid": workspace.uids["pod"],
    }
    assert paused["message"] == "KV cache usage 0.93 >= 0.90"
    assert paused["source"] == {"component": "vllm-sidecar"}
    assert paused["count"] == 1
    assert paused["firstTimestamp"] == paused["lastTimestamp"]
    assert re.fullmatch(rf"{workspace.pod}\.[0-9a-f]+", paused["metadata"]["name"])
    assert len(failed["message"]) == 1024


CASES = [(mode.value, permission) for mode, needed in PERMISSIONS.items() for permission in needed]


@pytest.mark.parametrize(("mode", "permission"), CASES, ids=[f"{mode}-{p.verb}-{p.resource}" for mode, p in CASES])
async def test_each_permission_is_needed_and_named(
    apiserver: ApiServer, admin: httpx.Client, mode: str, permission: Any
) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(without=(permission.verb, permission.resource, permission.group))
    space.create_workload()
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        outcome = await actuator(mode, space, kube).restart(reason="x", dry_run=False)
    finally:
        await kube.close()
    assert outcome.status is OutcomeStatus.FAILED
    group = permission.group or '"" (core)'
    assert outcome.detail == (
        f"forbidden: cannot {permission.verb} {permission.resource} in namespace {space.namespace} "
        f"as system:serviceaccount:{space.namespace}:vllm-sidecar; the Role must grant verb {permission.verb} "
        f"on resource {permission.resource} in API group {group} (see deploy/kubernetes/add-sidecar/rbac.yaml)"
    )
    assert space.pod_exists()
    assert space.deployment_document()["metadata"]["generation"] == 1


async def test_events_without_create_say_so_and_without_get_lose_only_the_uid(
    apiserver: ApiServer, admin: httpx.Client
) -> None:
    get_pods, create_events = EVENT_PERMISSIONS
    for missing in (create_events, get_pods):
        space = Workspace.create(apiserver, admin)
        space.apply_rbac(without=(missing.verb, missing.resource, missing.group))
        space.create_workload()
        kube = KubeClient(space.credentials(space.sidecar_token()))
        events = KubernetesEvents(kube, pod=space.pod, namespace=space.namespace)
        await events.emit(reason="RestartStarted", message="evicting", warning=False)
        await kube.close()
        if missing is create_events:
            assert events.last_error is not None
            assert events.last_error.startswith("event RestartStarted not recorded: forbidden: cannot create events")
            assert space.events() == []
        else:
            assert events.last_error is None
            (event,) = space.events()
            assert "uid" not in event["involvedObject"]


async def test_the_role_lets_the_sidecar_ask_for_the_vllm_containers_log(
    workspace: Workspace, client: KubeClient
) -> None:
    """No kubelet here, so no log can come back: the requests pass authentication and RBAC (with the shipped
    Role) and the API server answers 204 No Content (the pod is on no node), which reads as an empty log. A
    log's reading and the request's shape are tested against a strict fake (tests/cause/test_kube_logs.py)."""
    read = await PodLog(client, pod=workspace.pod, namespace=workspace.namespace).read(
        until_wall_s=WALL_S, wanted=Wanted.DIED
    )
    assert [(run.label, run.text) for run in read.runs] == [("previous instance", ""), ("current instance", "")]


async def test_without_get_pods_log_the_cause_names_the_missing_rule(apiserver: ApiServer, admin: httpx.Client) -> None:
    (permission,) = LOG_PERMISSIONS
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(without=(permission.verb, permission.resource, permission.group))
    space.create_workload()
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        with pytest.raises(LogUnreadableError) as caught:
            await PodLog(kube, pod=space.pod, namespace=space.namespace).read(until_wall_s=WALL_S, wanted=Wanted.LAST)
    finally:
        await kube.close()
    assert str(caught.value) == (
        f"forbidden: cannot get pods/log in namespace {space.namespace} as "
        f"system:serviceaccount:{space.namespace}:vllm-sidecar; the Role must grant verb get on resource pods/log "
        'in API group "" (core) (see deploy/kubernetes/add-sidecar/rbac.yaml)'
    )


async def test_missing_pod_fails_with_not_found(workspace: Workspace, client: KubeClient) -> None:
    for mode in ("evict", "delete", "rollout"):
        adapter = KubernetesActuator(mode, pod="vllm-gone", namespace=workspace.namespace, client=client)
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.FAILED
        assert outcome.detail.startswith(f"not found: pod vllm-gone in namespace {workspace.namespace} (HTTP 404"), (
            outcome.detail
        )


async def test_rollout_refuses_a_pod_without_a_deployment(workspace: Workspace, client: KubeClient) -> None:
    bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    workspace.post("/api/v1/namespaces/{ns}/pods", bare)
    adapter = KubernetesActuator("rollout", pod="bare", namespace=workspace.namespace, client=client)
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.detail == "pod bare has no controller, so no Deployment to restart (use mode evict or delete)"


async def test_rollout_refuses_an_owner_that_was_replaced(workspace: Workspace, client: KubeClient) -> None:
    """The pod's ownerReference names a ReplicaSet whose uid is not the one that exists now."""
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": workspace.replica_set,
        "uid": "0" * 8,
        "controller": True,
    }
    workspace.post(
        "/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "orphan", "ownerReferences": [owner]},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )
    adapter = KubernetesActuator("rollout", pod="orphan", namespace=workspace.namespace, client=client)
    outcome = await adapter.restart(reason="x", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert "was replaced" in outcome.detail
    assert workspace.deployment_document()["metadata"]["generation"] == 1


async def test_in_cluster_credentials_reread_a_rotated_token(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-cluster form (lightkube's `KubeConfig.from_service_account`, its folder set to a temp dir): the
    projected token file changes under a running sidecar, and a 401 makes lightkube read it again."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("expired-token")
    (directory / "ca.crt").write_text(workspace.server.ca_file.read_text())
    (directory / "namespace").write_text(workspace.namespace)
    port = workspace.server.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port, "POD_NAME": workspace.pod}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # lightkube reads the address from the process's environment
    kube, pod = connect(env=env, service_account_dir=directory)
    assert (pod.name, pod.namespace) == (workspace.pod, workspace.namespace)
    adapter = KubernetesActuator("evict", pod=pod.name, namespace=pod.namespace, client=kube)
    try:
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.FAILED
        assert (
            outcome.detail
            == "unauthorized: the API server rejected the credentials from in-cluster (HTTP 401: Unauthorized)"
        )
        (directory / "token").write_text(workspace.sidecar_token() + "\n")  # the kubelet rotated it
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    finally:
        await adapter.close()
    assert not workspace.pod_exists()


async def test_kubeconfig_with_a_client_certificate(apiserver: ApiServer, admin: httpx.Client, tmp_path: Path) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(user="cert-user")
    space.create_workload()
    cert, key = apiserver.client_certificate("cert-user")
    ca = tmp_path / "ca.crt"
    ca.write_text(apiserver.ca_file.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u", "namespace": space.namespace}}],
        "clusters": [{"name": "c", "cluster": {"server": apiserver.url, "certificate-authority": "ca.crt"}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate-data": base64.b64encode(cert.encode()).decode(),
                    "client-key-data": base64.b64encode(key.encode()).decode(),
                },
            }
        ],
    }
    (tmp_path / "config").write_text(yaml.safe_dump(config))
    credentials = kubeconfig_credentials(tmp_path / "config")
    assert credentials.namespace == space.namespace
    outcome = await restart_once(KubeClient(credentials), space)
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert space.deployment_document()["metadata"]["generation"] == 2


async def restart_once(kube: KubeClient, space: Workspace, mode: str = "rollout") -> ActuatorOutcome:
    adapter = KubernetesActuator(mode, pod=space.pod, namespace=space.namespace, client=kube)
    try:
        return await adapter.restart(reason="x", dry_run=False)
    finally:
        await adapter.close()


def kubeconfig(folder: Path, server: ApiServer, user: dict[str, Any], *, namespace: str) -> Path:
    """A kubeconfig file for `server` (its CA given inline) with `user` as the context's user."""
    ca = base64.b64encode(server.ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u", "namespace": namespace}}],
        "clusters": [{"name": "c", "cluster": {"server": server.url, "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": user}],
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_kubeconfig_with_an_exec_plugin_run_again_after_a_401(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    """The EKS/GKE/AKS form: the user is an exec credential plugin (here a script printing an ExecCredential
    with the token it is given). The token it first hands out is refused (an expired one); once it hands out
    one the API server knows, the next request's 401 makes lightkube run it again and retry."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(user=EXEC_USER)
    space.create_workload()
    current, runs = tmp_path / "current-token", tmp_path / "runs"
    current.write_text("expired-token")
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{runs}"\n'
        f'printf \'{{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", '
        f'"status": {{"token": "%s"}}}}\' "$(cat "{current}")"\n'
    )
    plugin.chmod(0o755)
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "./credential-plugin",  # relative to the kubeconfig's folder, as kubectl takes it
            "args": ["--cluster", "test"],
            "interactiveMode": "Never",
            "provideClusterInfo": False,
        }
    }
    kube, pod = connect(
        kubeconfig(tmp_path, apiserver, exec_user, namespace=space.namespace), env={"POD_NAME": space.pod}
    )
    assert (pod.name, pod.namespace) == (space.pod, space.namespace)
    adapter = KubernetesActuator("rollout", pod=pod.name, namespace=pod.namespace, client=kube)
    try:
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.FAILED
        assert outcome.detail.startswith("unauthorized: the API server rejected the credentials from kubeconfig ")
        current.write_text(EXEC_TOKEN)  # the plugin now hands out a token the API server knows
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    finally:
        await adapter.close()
    assert space.deployment_document()["metadata"]["generation"] == 2
    assert runs.read_text().count("run") == 2  # once at the first request, once after the 401; not per request


async def test_kubeconfig_with_a_token_file_that_rotates(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac()
    space.create_workload()
    token = tmp_path / "token"
    token.write_text("expired-token\n")
    path = kubeconfig(tmp_path, apiserver, {"tokenFile": "token"}, namespace=space.namespace)  # relative to it
    kube, pod = connect(path, env={"POD_NAME": space.pod})
    adapter = KubernetesActuator("delete", pod=pod.name, namespace=pod.namespace, client=kube, grace_period_s=0)
    try:
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.detail == (
            f"unauthorized: the API server rejected the credentials from kubeconfig {path} (context test) "
            "(HTTP 401: Unauthorized)"
        )
        assert space.pod_exists()
        token.write_text(space.sidecar_token() + "\n")  # rotated
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    finally:
        await adapter.close()
    assert not space.pod_exists()


async def test_connect_says_in_one_line_what_it_cannot_authenticate_with(apiserver: ApiServer, tmp_path: Path) -> None:
    """A kubeconfig whose CA is not a certificate fails at start (lightkube loads it there), in one line."""
    path = kubeconfig(tmp_path, apiserver, {"token": "t"}, namespace="default")
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(b"not a PEM").decode()
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(CredentialsError) as caught:
        connect(path, env={"POD_NAME": "p"})
    assert str(caught.value).startswith(f"kubeconfig {path} (context test): ")
    assert "\n" not in str(caught.value)


def test_the_daemon_evicts_its_hung_pod_and_reports_events(workspace: Workspace, tmp_path: Path) -> None:
    """The whole daemon with --actuator kubernetes against the real apiserver: a hung (simulated) vLLM in
    this pod is drained and its pod evicted, with Kubernetes Events on the pod for the pause and restart."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": workspace.server.url,
                            "certificate-authority": str(workspace.server.ca_file),
                        },
                    }
                ],
                "users": [{"name": "sidecar", "user": {"token": workspace.sidecar_token()}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "sidecar"}}],
            }
        )
    )
    sim = SimProcess("hang", tmp_path / "sim.log", "--hang-after-s", "2")
    sidecar = None
    load = None
    try:
        sim.wait_healthy()
        sidecar = SidecarProcess(
            [
                *(
                    "--vllm-url",
                    sim.url,
                    "--gpu-source",
                    "sim",
                    "--interval",
                    "0.5",
                    "--state-dir",
                    str(tmp_path / "s"),
                ),
                *("--actuator", "kubernetes", "--kubernetes-mode", "evict", "--kubeconfig", str(kubeconfig)),
                *("--pod-name", workspace.pod, "--pod-namespace", workspace.namespace, "--kubernetes-events"),
                *("--hung-after", "3", "--drain-timeout", "1"),
                *("--probe-timeout", "2"),  # the engine probe proves the simulator's hang: no answer in 2 s
            ],
            tmp_path / "sidecar.log",
        )
        sidecar.wait_ready()
        load = subprocess.Popen(
            [
                *(sys.executable, "-m", "sidecar", "loadtest", "--url", sim.url, "--quiet", "--json"),
                *("--concurrency", "4", "--duration", "10", "--timeout", "3"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 40
        while workspace.pod_exists() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not workspace.pod_exists(), "the pod was not evicted"
        time.sleep(1.5)  # the events are sent from the notifier's queue
    finally:
        if load is not None:
            load.kill()
        if sidecar is not None:
            sidecar.kill()
        sim.stop()
    assert sidecar is not None
    log = [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if line.startswith("{")]
    outcomes = [(e["adapter"], e["status"]) for e in log if e["event"] == "restart_outcome"]
    assert outcomes == [("kubernetes", "done")]
    reasons = [event["reason"] for event in workspace.events() if event["involvedObject"]["name"] == workspace.pod]
    assert "AdmissionPaused" in reasons
    assert "RestartStarted" in reasons


async def test_a_v1_exec_plugin_is_told_what_kubectl_tells_it(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    """ExecCredential v1 (what current plugins and `aws eks update-kubeconfig` may write): the plugin refuses to
    answer unless KUBERNETES_EXEC_INFO says v1, not interactive, and (provideClusterInfo) this cluster."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(user=EXEC_USER)
    space.create_workload()
    plugin = tmp_path / "credential-plugin"
    v1 = "client.authentication.k8s.io/v1"
    plugin.write_text(
        "#!/bin/sh\n"
        'case "$KUBERNETES_EXEC_INFO" in\n'
        f'  *\'"apiVersion": "{v1}"\'*\'"interactive": false\'*\'"server": "{apiserver.url}"\'*) ;;\n'
        '  *) echo "unexpected KUBERNETES_EXEC_INFO: $KUBERNETES_EXEC_INFO" >&2; exit 1 ;;\n'
        "esac\n"
        f'printf \'{{"apiVersion": "{v1}", "kind": "ExecCredential", '
        f'"status": {{"token": "{EXEC_TOKEN}", "expirationTimestamp": "2100-01-01T00:00:00Z"}}}}\'\n'
    )
    plugin.chmod(0o755)
    user = {"exec": {"apiVersion": v1, "command": str(plugin), "interactiveMode": "Never", "provideClusterInfo": True}}
    kube, _ = connect(kubeconfig(tmp_path, apiserver, user, namespace=space.namespace), env={"POD_NAME": space.pod})
    outcome = await restart_once(kube, space)
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert space.deployment_document()["metadata"]["generation"] == 2


async def test_an_oidc_user_whose_id_token_expired_is_refreshed_at_the_issuer(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    """The `oidc` auth-provider as `kubectl oidc-login setup` or a platform's installer writes it: the id-token
    in the kubeconfig has expired, so the refresh-token buys a new one at the issuer (over TLS with the
    kubeconfig's idp CA), which the API server accepts; later requests reuse it until it expires."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(user=OIDC_USER)
    space.create_workload()
    issuer = OidcIssuer(
        tmp_path / "idp",
        client_id="kube:cli",
        client_secret="s3cret",  # noqa: S106 - a fixture
        refresh_token="r0",  # noqa: S106 - a fixture
        id_token=OIDC_TOKEN,
    )
    expired = OIDC_TOKEN.replace(OIDC_TOKEN.split(".")[1], base64.urlsafe_b64encode(b'{"exp":1}').decode().rstrip("="))
    config = {
        "idp-issuer-url": issuer.url,
        "client-id": "kube:cli",
        "client-secret": "s3cret",
        "id-token": expired,
        "refresh-token": "r0",
        "idp-certificate-authority-data": base64.b64encode(issuer.ca_pem().encode()).decode(),
    }
    user = {"auth-provider": {"name": "oidc", "config": config}}
    kube, pod = connect(kubeconfig(tmp_path, apiserver, user, namespace=space.namespace), env={"POD_NAME": space.pod})
    stamps = iter((WALL_S, WALL_S + 60))  # two restarts a minute apart: two restartedAt, two generations
    adapter = KubernetesActuator(
        "rollout", pod=pod.name, namespace=pod.namespace, client=kube, wall_clock=lambda: next(stamps)
    )
    try:
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    finally:
        await adapter.close()
        issuer.close()
    assert issuer.calls == ["GET /realms/ml/.well-known/openid-configuration", "POST /realms/ml/token ok"]
    assert space.deployment_document()["metadata"]["generation"] == 3


async def test_a_user_that_impersonates_the_service_account_acts_with_its_role(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    """`as:` in the kubeconfig: a user with no rights of its own acts as the vllm-sidecar ServiceAccount once it
    may impersonate it; before that, the refusal names the impersonation, not the eviction."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac()
    space.create_workload()
    account = f"system:serviceaccount:{space.namespace}:vllm-sidecar"
    user = {"token": IMPERSONATOR_TOKEN, "as": account}
    kube, pod = connect(kubeconfig(tmp_path, apiserver, user, namespace=space.namespace), env={"POD_NAME": space.pod})
    adapter = KubernetesActuator("delete", pod=pod.name, namespace=pod.namespace, client=kube, grace_period_s=0)
    try:
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.FAILED
        assert outcome.detail.startswith(
            f"forbidden: {IMPERSONATOR} may not impersonate whom the kubeconfig's `as` names; grant it verb "
            "impersonate on that user or service account ("
        ), outcome.detail
        assert space.pod_exists()
        rule = {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}
        rule["resourceNames"] = ["vllm-sidecar"]
        rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
        space.post(f"{rbac}/roles", {"metadata": {"name": "impersonate"}, "rules": [rule]})
        subject = {"kind": "User", "name": IMPERSONATOR, "apiGroup": "rbac.authorization.k8s.io"}
        role_ref = {"kind": "Role", "name": "impersonate", "apiGroup": "rbac.authorization.k8s.io"}
        space.post(
            f"{rbac}/rolebindings", {"metadata": {"name": "impersonate"}, "subjects": [subject], "roleRef": role_ref}
        )
        space.wait_until_allowed(IMPERSONATOR, "impersonate", "serviceaccounts", name="vllm-sidecar")
        outcome = await adapter.restart(reason="x", dry_run=False)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    finally:
        await adapter.close()
    assert not space.pod_exists()


@pytest.mark.parametrize(("name", "accepted"), [("kubernetes.default.svc", True), ("not-this-server.example", False)])
async def test_the_server_certificate_is_checked_against_tls_server_name(
    workspace: Workspace, tmp_path: Path, name: str, accepted: bool
) -> None:
    """The API server's certificate names kubernetes.default.svc (and 127.0.0.1); with `tls-server-name` set,
    that name and no other is what it must hold."""
    path = kubeconfig(tmp_path, workspace.server, {"token": workspace.sidecar_token()}, namespace=workspace.namespace)
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"]["tls-server-name"] = name
    path.write_text(yaml.safe_dump(config))
    kube, _ = connect(path, env={"POD_NAME": workspace.pod})
    outcome = await restart_once(kube, workspace)
    if accepted:
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
    else:
        assert outcome.status is OutcomeStatus.FAILED
        assert "certificate verify failed" in outcome.detail
        assert "not-this-server.example" in outcome.detail


async def test_an_exec_plugin_that_answers_a_client_certificate(
    apiserver: ApiServer, admin: httpx.Client, tmp_path: Path
) -> None:
    """The form `tsh kube credentials` (Teleport) answers: no token, a client certificate and key the API
    server's client CA signed. It is presented in the TLS handshake of each connection."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(user="cert-user")
    space.create_workload()
    cert, key = apiserver.client_certificate("cert-user")
    v1 = "client.authentication.k8s.io/v1"
    answer = {
        "apiVersion": v1,
        "kind": "ExecCredential",
        "status": {"clientCertificateData": cert, "clientKeyData": key},
    }
    (tmp_path / "credential.json").write_text(json.dumps(answer))
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(f'#!/bin/sh\necho run >> "{tmp_path}/runs"\ncat "{tmp_path}/credential.json"\n')
    plugin.chmod(0o755)
    user = {"exec": {"apiVersion": v1, "command": str(plugin), "interactiveMode": "Never"}}
    kube, _ = connect(kubeconfig(tmp_path, apiserver, user, namespace=space.namespace), env={"POD_NAME": space.pod})
    outcome = await restart_once(kube, space)  # four requests: three reads and the patch
    assert outcome.status is OutcomeStatus.DONE, outcome.detail
    assert space.deployment_document()["metadata"]["generation"] == 2
    assert (tmp_path / "runs").read_text().count("run") == 1


def _container_ended(space: Workspace, pod: str, exit_code: int) -> None:
    """What a kubelet reports once vLLM's container has exited; the admin writes the status subresource."""
    ended = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}}
    status = {"name": "vllm", "state": ended, "ready": False, "restartCount": 0, "image": "vllm", "imageID": ""}
    patch = {"status": {"phase": "Running", "containerStatuses": [status]}}
    path = f"/api/v1/namespaces/{space.namespace}/pods/{pod}/status"
    headers = {"Content-Type": "application/merge-patch+json"}
    answer = space.admin.patch(path, content=json.dumps(patch), headers=headers)
    assert answer.is_success, answer.text


async def test_who_restarts_vllm_is_read_from_the_pod_and_a_hard_delete_kills_at_once(
    apiserver: ApiServer, admin: httpx.Client
) -> None:
    """A Deployment's pod (restartPolicy Always) is the kubelet's to restart whatever vLLM's exit; a pod under
    OnFailure whose vLLM exited 0 is nobody's. A hard restart deletes with a grace period of 1 s, which a pod on
    a node keeps until its kubelet confirms the containers are gone."""
    space = Workspace.create(apiserver, admin)
    space.apply_rbac()
    space.create_workload()
    bare = "vllm-job"
    spec = {**POD_SPEC, "restartPolicy": "OnFailure", "nodeName": "node-1"}
    space.post("/api/v1/namespaces/{ns}/pods", {"metadata": {"name": bare}, "spec": spec})
    kube = KubeClient(space.credentials(space.sidecar_token()))
    deployed = actuator("delete", space, kube)
    alone = KubernetesActuator("delete", pod=bare, namespace=space.namespace, client=kube)
    try:
        pending = await deployed.supervision()
        assert (pending.restarter, pending.detail) == (
            Restarter.SUPERVISOR,
            "the pod is pending: the kubelet is starting it",
        )
        _container_ended(space, space.pod, 0)
        always = await deployed.supervision()
        assert (always.restarter, always.detail) == (
            Restarter.SUPERVISOR,
            "container vllm ended (exit 0); restartPolicy Always: the kubelet restarts it",
        )
        _container_ended(space, bare, 0)
        nobody = await alone.supervision()
        assert (nobody.restarter, nobody.detail) == (
            Restarter.SIDECAR,
            "container vllm ended (exit 0); restartPolicy OnFailure: the kubelet will not restart it",
        )
        outcome = await alone.restart(reason="engine_dead", dry_run=False, hard=True)
        assert outcome.status is OutcomeStatus.DONE, outcome.detail
        assert outcome.detail == f"deleted pod {bare} in namespace {space.namespace}, grace period 1 s"
        left = space.get(f"/api/v1/namespaces/{{ns}}/pods/{bare}").json()
        assert left["metadata"]["deletionGracePeriodSeconds"] == 1  # kept for the kubelet this server lacks
        deleting = await alone.supervision()
        assert deleting.restarter is Restarter.SUPERVISOR
    finally:
        await kube.close()


async def test_a_pod_the_sidecar_may_not_read_leaves_the_restart_to_the_kubelet(
    apiserver: ApiServer, admin: httpx.Client
) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(without=("get", "pods", ""))
    space.create_workload()
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        said = await actuator("delete", space, kube).supervision()
    finally:
        await kube.close()
    assert said.restarter is Restarter.UNKNOWN
    assert said.detail.startswith("cannot read the pod: forbidden: cannot get pods in namespace "), said.detail
