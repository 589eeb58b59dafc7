"""deploy/kubernetes as `kubectl apply -k` would send it: the complete example (base) and the add-sidecar
component on an existing vLLM Deployment, with the opt-in components (add-probe, add-incidents, add-remediation).

Checked: the Kubernetes schemas in strict mode (kubernetes-validate) and the ServiceMonitor's required fields
(no schema for it here, see its test); the drain arithmetic and the probe wiring, read from the rendered pod; the
sidecar's settings through the sidecar's own settings parser; the allocator probe's wiring (add-probe: the shared
folder, the plugin copied from the sidecar's image onto vLLM's PYTHONPATH); and a real kube-apiserver 1.20
accepting the objects and answering, for the sidecar's ServiceAccount, exactly the requests the Kubernetes
adapter makes.

kubectl, kubernetes-validate, the apiserver binary and etcd skip these tests where missing,
except in CI (CI=true, or VLLM_SIDECAR_REQUIRE_KUBE=1), where that is a failure.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
import yaml

from sidecar import __version__
from sidecar.actuators.kube_credentials import POD_NAME_ENV, POD_NAMESPACE_ENV, SERVICE_ACCOUNT_DIR
from sidecar.actuators.kube_flags import PERMISSIONS as FLAGS_PERMISSIONS
from sidecar.actuators.kube_logs import LOG_PERMISSIONS
from sidecar.actuators.kubernetes import EVENT_PERMISSIONS, PERMISSIONS
from sidecar.shell.settings import ENV_PREFIX, Settings, load_settings
from tests.actuators.kube_apiserver import ApiServer, StartError, UnavailableError, start_apiserver
from tests.ship.kube_apply import create, dropped_fields, for_kubernetes_1_20, service_account_may
from tests.ship.kube_manifests import (
    BASE_DIR,
    COMPONENT_DIR,
    EXISTING_DEPLOYMENT,
    INCIDENTS_COMPONENT_DIR,
    KUBERNETES_DIR,
    PLUGIN_INIT,
    PLUGIN_NAME,
    PROBE_COMPONENT_DIR,
    PROBE_DIR_ENV,
    REMEDIATION_COMPONENT_DIR,
    REPO,
    SIDECAR,
    KubectlMissingError,
    Manifest,
    container,
    env_source,
    find,
    image_version,
    init_container,
    literal_env,
    mount_volume,
    option,
    pod_spec,
    port_number,
    prestop_sleep_s,
    probe_budget_s,
    probe_wiring_problems,
    render,
    render_overlay,
    vllm_container,
)

REQUIRE_ENV = "VLLM_SIDECAR_REQUIRE_KUBE"
# Oldest first: 1.27 is the first release with unhealthyPodEvictionPolicy on by default; 1.32 is the kubectl
# here; 1.37 the newest schema kubernetes-validate ships.
SCHEMA_VERSIONS = ("1.27.0", "1.32.0", "1.37.0")
# After --shutdown-timeout, vLLM aborts what is left and stops its engine (under a second measured on 0.32);
# the margin is for that and for a slow node.
SHUTDOWN_MARGIN_S = 10
# Model load, download included, that the startupProbe must allow before the kubelet kills vLLM.
MODEL_LOAD_BUDGET_S = 15 * 60
# The kubelet's longest back-off between restarts of a crashing container.
KUBELET_MAX_BACKOFF_S = 300
# vLLM's --shutdown-timeout came in 0.18; older versions do not know the flag and refuse to start.
SHUTDOWN_TIMEOUT_SINCE = (0, 18)
SIDECAR_IMAGE = "ghcr.io/vllm-sidecar/vllm-sidecar"
# From the ServiceMonitor CRD (prometheus-operator v0.84.1): the endpoint fields used here, all strings, and
# the pattern the CRD gives `interval`.
SERVICE_MONITOR_ENDPOINT_FIELDS = ("port", "path", "interval")
SERVICE_MONITOR_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1"


def _unavailable(what: str) -> NoReturn:
    if _required():
        pytest.fail(f"required here (CI=true or {REQUIRE_ENV}=1): {what}", pytrace=False)
    pytest.skip(what)


def _render(directory: Path) -> list[Manifest]:
    try:
        return render(directory)
    except KubectlMissingError as error:
        _unavailable(str(error))


@pytest.fixture(scope="module")
def base() -> list[Manifest]:
    return _render(BASE_DIR)


@pytest.fixture(scope="module")
def existing(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """A user's overlay: their own vLLM Deployment, in their namespace, with the add-sidecar component."""
    folder = tmp_path_factory.mktemp("existing")
    try:
        return render_overlay(folder, namespace="team-a", resources=[EXISTING_DEPLOYMENT], components=[COMPONENT_DIR])
    except KubectlMissingError as error:
        _unavailable(str(error))


@pytest.fixture(scope="module")
def existing_with_probe(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """The same user's Deployment, its container renamed `vllm` (add-probe finds vLLM's container by that
    name), with both components."""
    source = tmp_path_factory.mktemp("existing-probe-source") / EXISTING_DEPLOYMENT.name
    source.write_text(yaml.safe_dump(_existing_named("vllm")))
    folder = tmp_path_factory.mktemp("existing-probe")
    try:
        return render_overlay(
            folder, namespace="team-a", resources=[source], components=[COMPONENT_DIR, PROBE_COMPONENT_DIR]
        )
    except KubectlMissingError as error:
        _unavailable(str(error))


@pytest.fixture(scope="module")
def with_incidents(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """The complete example with add-incidents."""
    folder = tmp_path_factory.mktemp("incidents")
    try:
        return render_overlay(folder, namespace="vllm", resources=[BASE_DIR], components=[INCIDENTS_COMPONENT_DIR])
    except KubectlMissingError as error:
        _unavailable(str(error))


@pytest.fixture(scope="module")
def existing_with_incidents(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """A user's own Deployment (no Namespace in the overlay) with add-sidecar and add-incidents."""
    folder = tmp_path_factory.mktemp("existing-incidents")
    try:
        return render_overlay(
            folder,
            namespace="team-a",
            resources=[EXISTING_DEPLOYMENT],
            components=[COMPONENT_DIR, INCIDENTS_COMPONENT_DIR],
        )
    except KubectlMissingError as error:
        _unavailable(str(error))


def _existing_named(name: str) -> Manifest:
    document: Manifest = yaml.safe_load(EXISTING_DEPLOYMENT.read_text())
    pod_spec(document)["containers"][0]["name"] = name
    return document


def _sidecar_settings(item: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The container's literal VLLM_SIDECAR_* environment, read by the sidecar's own settings loader."""
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in literal_env(item).items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return load_settings({})


# --- what is there -------------------------------------------------------------------------------------


def test_base_holds_the_whole_example_in_one_namespace(base: list[Manifest]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in base)
    assert kinds == [
        ("Deployment", "vllm"),
        ("Namespace", "vllm"),
        ("PodDisruptionBudget", "vllm"),
        ("Role", SIDECAR),
        ("RoleBinding", SIDECAR),
        ("Service", "vllm"),
        ("ServiceAccount", SIDECAR),
        ("ServiceMonitor", "vllm"),
    ]
    assert {d["metadata"].get("namespace") for d in base if d["kind"] != "Namespace"} == {"vllm"}
    deployment = find(base, "Deployment")
    assert [c["name"] for c in pod_spec(deployment)["containers"]] == [SIDECAR, "vllm"]
    vllm = container(deployment, "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert option(vllm["args"], "--model")
    assert mount_volume(deployment, vllm, Path("/dev/shm"))[0]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_manifests_pass_the_kubernetes_schemas_strictly(
    base: list[Manifest], existing: list[Manifest], existing_with_probe: list[Manifest], version: str
) -> None:
    """Every rendered object but the ServiceMonitor (a CRD, which has no schema here: see its own test)."""
    validator = _kubernetes_validate()
    for document in [*base, *existing, *existing_with_probe]:
        if document["kind"] != "ServiceMonitor":
            validator.validate(document, version, strict=True)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_add_incidents_passes_the_kubernetes_schemas_strictly(
    with_incidents: list[Manifest], existing_with_incidents: list[Manifest], version: str
) -> None:
    validator = _kubernetes_validate()
    for document in [*with_incidents, *existing_with_incidents]:
        if document["kind"] != "ServiceMonitor":
            validator.validate(document, version, strict=True)


@pytest.fixture(scope="module")
def existing_with_remediation(tmp_path_factory: pytest.TempPathFactory) -> list[Manifest]:
    """A user's own Deployment with add-sidecar and add-remediation."""
    folder = tmp_path_factory.mktemp("existing-remediation")
    try:
        return render_overlay(
            folder,
            namespace="team-a",
            resources=[EXISTING_DEPLOYMENT],
            components=[COMPONENT_DIR, REMEDIATION_COMPONENT_DIR],
        )
    except KubectlMissingError as error:
        _unavailable(str(error))


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_add_remediation_passes_the_kubernetes_schemas_strictly(
    existing_with_remediation: list[Manifest], version: str
) -> None:
    validator = _kubernetes_validate()
    for document in existing_with_remediation:
        validator.validate(document, version, strict=True)


def test_add_remediation_adds_only_a_role_for_the_sidecars_account(
    existing: list[Manifest], existing_with_remediation: list[Manifest]
) -> None:
    """RBAC and nothing else: the Deployment is as add-sidecar left it (the flag ranges are the user's to set)."""
    added = [document for document in existing_with_remediation if document not in existing]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in added) == [
        ("Role", "vllm-sidecar-remediation"),
        ("RoleBinding", "vllm-sidecar-remediation"),
    ]
    assert [d for d in existing if d not in existing_with_remediation] == []
    binding = find(added, "RoleBinding")
    assert binding["subjects"] == find(existing, "RoleBinding", "vllm-sidecar")["subjects"]
    assert binding["roleRef"]["name"] == "vllm-sidecar-remediation"
    assert all(d["metadata"].get("namespace") == "team-a" for d in added)


def test_the_schema_check_rejects_an_unknown_field(base: list[Manifest]) -> None:
    """The check above is only worth something if strict mode refuses a misspelt field."""
    validator = _kubernetes_validate()
    deployment = copy.deepcopy(find(base, "Deployment"))
    container(deployment, SIDECAR)["readinesProbe"] = container(deployment, SIDECAR)["readinessProbe"]
    with pytest.raises(validator.ValidationError):
        validator.validate(deployment, SCHEMA_VERSIONS[1], strict=True)


def _kubernetes_validate() -> Any:  # the package ships no type information
    try:
        return importlib.import_module("kubernetes_validate")
    except ImportError:
        _unavailable("kubernetes-validate is not installed (pip install kubernetes-validate)")


def test_servicemonitor_has_what_the_prometheus_operator_crd_requires(base: list[Manifest]) -> None:
    """kubernetes-validate has no schema for CRDs, and none can be had offline without side effects (the one
    Python package with the ServiceMonitor's schema, cloudcoil-models-prometheus-operator, installs a pytest
    plugin that breaks every pytest run without filelock). So this checks the CRD's required fields and the
    type and format of each field used, restated from monitoring.coreos.com/v1 of prometheus-operator
    v0.84.1, and that no other field is used: a smaller check than the schema, said as such."""
    monitor = find(base, "ServiceMonitor")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) == {"selector", "endpoints"}  # both required by the CRD
    selector = monitor["spec"]["selector"]
    assert set(selector) <= {"matchLabels", "matchExpressions"}
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in selector["matchLabels"].items())
    assert monitor["spec"]["endpoints"], "at least one endpoint"
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= set(SERVICE_MONITOR_ENDPOINT_FIELDS), endpoint
        assert all(isinstance(value, str) for value in endpoint.values()), endpoint
        assert SERVICE_MONITOR_DURATION.fullmatch(endpoint["interval"]), endpoint["interval"]
        assert endpoint["path"].startswith("/")
    # It scrapes the Service, both ports by name: the sidecar's and vLLM's own /metrics.
    service = find(base, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    deployment = find(base, "Deployment")
    targets = {
        (endpoint["port"], endpoint["path"], service_ports[endpoint["port"]]["targetPort"])
        for endpoint in monitor["spec"]["endpoints"]
    }
    assert targets == {("metrics", "/metrics", "metrics"), ("http", "/metrics", "http")}
    assert port_number(container(deployment, SIDECAR), "metrics") == 9468
    assert port_number(container(deployment, "vllm"), "http") == 8000
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


# --- the drain recipe and the probes --------------------------------------------------------------------


def test_the_drain_fits_in_the_grace_period(base: list[Manifest]) -> None:
    _assert_the_drain_fits(find(base, "Deployment"))


def _assert_the_drain_fits(deployment: Manifest) -> None:
    """preStop sleep (routers stop sending) + --shutdown-timeout (running requests finish) + a margin must fit
    in terminationGracePeriodSeconds, or the kubelet kills vLLM in the middle of its drain."""
    vllm = container(deployment, "vllm")
    sleep_s = prestop_sleep_s(vllm)
    shutdown_timeout = option(vllm["args"], "--shutdown-timeout")
    assert shutdown_timeout is not None, "without --shutdown-timeout vLLM aborts running requests on SIGTERM"
    shutdown_s = int(shutdown_timeout)
    grace_s = int(pod_spec(deployment)["terminationGracePeriodSeconds"])
    assert sleep_s >= 5, "endpoint changes take seconds to reach kube-proxy and routers"
    assert shutdown_s > 0, "0 means abort running requests"
    assert sleep_s + shutdown_s + SHUTDOWN_MARGIN_S <= grace_s, (sleep_s, shutdown_s, grace_s)
    assert image_version(vllm["image"]) >= SHUTDOWN_TIMEOUT_SINCE, vllm["image"]


def test_vllm_probes_wait_for_the_model_and_watch_the_engine(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = find(base, "Deployment")
    vllm = container(deployment, "vllm")
    settings = _sidecar_settings(container(deployment, SIDECAR), monkeypatch)
    vllm_port = int(option(vllm["args"], "--port") or 8000)
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = vllm[kind]["httpGet"]
        assert (probe["path"], port_number(vllm, probe["port"])) == ("/health", vllm_port), kind
    assert probe_budget_s(vllm["startupProbe"]) >= MODEL_LOAD_BUDGET_S
    # The sidecar acts on a failing /health first (drain, budget, Event); the kubelet is the backstop.
    assert probe_budget_s(vllm["livenessProbe"]) > settings.dead_after
    # A crashed vLLM is the kubelet's to bring back: the sidecar must not replace a pod that is reloading.
    assert settings.down_after >= probe_budget_s(vllm["startupProbe"]) + KUBELET_MAX_BACKOFF_S


def test_the_pod_is_ready_only_when_vllm_is_healthy_and_the_sidecar_admits(
    base: list[Manifest], existing: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod is Ready when every container is: the sidecar's /readyz (503 while paused) and, in the base,
    vLLM's /health. /readyz alone would not do: it is 200 while vLLM is down (it only reports pauses)."""
    for rendered in (base, existing):
        deployment = find(rendered, "Deployment")
        sidecar = container(deployment, SIDECAR)
        settings = _sidecar_settings(sidecar, monkeypatch)
        probe = sidecar["readinessProbe"]
        assert probe["httpGet"]["path"] == "/readyz"
        assert port_number(sidecar, probe["httpGet"]["port"]) == settings.listen_address[1]
        assert probe.get("failureThreshold", 3) == 1, "the sidecar already applied its hysteresis: act on one 503"
        # A pause reaches the Service within a tick of the sidecar deciding it: no slower than it polls.
        assert probe.get("periodSeconds", 10) <= settings.interval
        assert probe.get("timeoutSeconds", 1) <= probe.get("periodSeconds", 10)
        liveness = sidecar["livenessProbe"]["httpGet"]
        assert liveness["path"] == "/healthz"
        assert port_number(sidecar, liveness["port"]) == settings.listen_address[1]
        assert "startupProbe" not in sidecar  # it answers within a second of starting
        assert vllm_container(deployment)["readinessProbe"]["httpGet"]["path"] == "/health"


# --- the sidecar container ------------------------------------------------------------------------------


def test_sidecar_settings_are_accepted_and_wired(base: list[Manifest], monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = find(base, "Deployment")
    sidecar, vllm = container(deployment, SIDECAR), container(deployment, "vllm")
    assert sidecar["image"] == f"{SIDECAR_IMAGE}:{__version__}", "the image tag follows the release"
    assert sidecar["command"] == ["vllm-sidecar", "run"]
    unknown = [n for n in literal_env(sidecar) if n.startswith(ENV_PREFIX)]
    unknown = [n for n in unknown if n.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields]
    assert unknown == [], "not settings of the sidecar"
    settings = _sidecar_settings(sidecar, monkeypatch)
    assert (settings.actuator, settings.kubernetes_mode, settings.kubernetes_events) == ("kubernetes", "evict", True)
    assert settings.dry_run is False
    assert settings.vllm_url == f"http://127.0.0.1:{port_number(vllm, 'http')}"
    # why vLLM died is read from this container's log; the setting's default names it too
    assert settings.vllm_container == vllm["name"] == Settings.model_fields["vllm_container"].default
    assert settings.listen_address == ("0.0.0.0", port_number(sidecar, "metrics"))
    # The adapter finds its pod through the downward API.
    assert env_source(sidecar, POD_NAME_ENV) == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env_source(sidecar, POD_NAMESPACE_ENV) == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # State on an emptyDir (the root filesystem is read-only); secrets optional, so a pod starts without them.
    assert "emptyDir" in mount_volume(deployment, sidecar, settings.state_dir)[0]
    assert settings.admin_token_file is not None
    token_volume, token_mount = mount_volume(deployment, sidecar, settings.admin_token_file)
    assert token_volume["secret"]["optional"] is True
    assert {"key": "admin-token", "path": str(settings.admin_token_file.relative_to(token_mount))} in token_volume[
        "secret"
    ]["items"]
    webhook = env_source(sidecar, ENV_PREFIX + "WEBHOOK_URL")
    assert webhook is not None
    assert webhook["secretKeyRef"]["optional"] is True


def test_sidecar_is_least_privileged(base: list[Manifest]) -> None:
    deployment = find(base, "Deployment")
    spec, sidecar = pod_spec(deployment), container(deployment, SIDECAR)
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] != 0
    dockerfile = REPO / "Dockerfile"
    if dockerfile.is_file():  # the image's own user, so what `ps` and file owners show is the same everywhere
        user = re.search(r"^USER (\d+):(\d+)$", dockerfile.read_text(), flags=re.MULTILINE)
        assert user is not None, "the Dockerfile names its user by number"
        assert (security["runAsUser"], security["runAsGroup"]) == (int(user[1]), int(user[2]))
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = sidecar["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}, "no GPU: it would take one"
    # Only the sidecar holds the ServiceAccount's token, at the path the in-cluster client reads.
    assert spec["automountServiceAccountToken"] is False
    api_access, mount_path = mount_volume(deployment, sidecar, SERVICE_ACCOUNT_DIR / "token")
    assert mount_path == SERVICE_ACCOUNT_DIR
    sources = api_access["projected"]["sources"]
    assert [next(iter(source)) for source in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    assert {item["path"] for source in sources[1:] for item in next(iter(source.values()))["items"]} == {
        "ca.crt",
        "namespace",
    }
    for other in spec["containers"]:
        if other["name"] != SIDECAR:
            assert all(m["name"] != api_access["name"] for m in other.get("volumeMounts", [])), other["name"]
    # The pod runs as the ServiceAccount the RoleBinding binds.
    binding = find(base, "RoleBinding")
    assert spec["serviceAccountName"] == find(base, "ServiceAccount")["metadata"]["name"] == SIDECAR
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SIDECAR, "namespace": "vllm"}]
    assert binding["roleRef"]["name"] == find(base, "Role")["metadata"]["name"]


def test_service_links_cannot_shadow_vllm_settings(base: list[Manifest]) -> None:
    """A Service named vllm puts VLLM_PORT=tcp://... into every pod of the namespace, which vLLM reads as its
    own setting and refuses to start. Service links must be off while any Service name starts with vllm."""
    links = pod_spec(find(base, "Deployment")).get("enableServiceLinks", True)  # on unless turned off
    # The kubelet names a Service's variables after it: vllm -> VLLM_PORT, VLLM_SERVICE_HOST, ...
    shadowing = [d["metadata"]["name"] for d in base if d["kind"] == "Service"]
    shadowing = [name for name in shadowing if (name.upper().replace("-", "_") + "_").startswith("VLLM_")]
    assert not (links and shadowing), f"service links are on and Services {shadowing} set VLLM_* variables"


def test_disruption_budget_lets_a_drained_pod_go_one_at_a_time(base: list[Manifest]) -> None:
    budget, deployment = find(base, "PodDisruptionBudget"), find(base, "Deployment")
    assert budget["apiVersion"] == "policy/v1"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The sidecar drains (its pod turns not Ready) before it evicts: minAvailable would count that pod as
    # already down and refuse a single replica's eviction forever.
    assert "minAvailable" not in budget["spec"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"


# --- the component on an existing Deployment ------------------------------------------------------------


def test_component_adds_only_the_sidecar_to_an_existing_deployment(
    base: list[Manifest], existing: list[Manifest]
) -> None:
    original = yaml.safe_load(EXISTING_DEPLOYMENT.read_text())
    deployment = find(existing, "Deployment", "mistral-7b")
    assert deployment["metadata"]["namespace"] == "team-a"
    spec, before = pod_spec(deployment), original["spec"]["template"]["spec"]
    assert vllm_container(deployment) == before["containers"][0], "the vLLM container is left as it was"
    assert [v for v in spec["volumes"] if v["name"] in {"cache-volume", "shm"}] == before["volumes"]
    # The same sidecar, volumes and pod settings as in the complete example, less the allocator probe's
    # parts (add-probe, which the base lists too).
    reference = find(base, "Deployment")
    assert container(deployment, SIDECAR) == _without_probe(container(reference, SIDECAR))
    assert "initContainers" not in spec
    patch = yaml.safe_load((COMPONENT_DIR / "sidecar.yaml").read_text())
    component_volumes = {v["name"] for v in pod_spec(patch)["volumes"]}
    added = [v for v in spec["volumes"] if v["name"] not in {v["name"] for v in before["volumes"]}]
    assert {v["name"] for v in added} == component_volumes
    assert added == [v for v in pod_spec(reference)["volumes"] if v["name"] in component_volumes]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (SIDECAR, False)
    assert deployment["spec"]["selector"] == original["spec"]["selector"]
    # The RBAC comes along, into the overlay's namespace.
    assert sorted(d["kind"] for d in existing) == ["Deployment", "Role", "RoleBinding", "ServiceAccount"]
    assert find(existing, "RoleBinding")["subjects"][0]["namespace"] == "team-a"


# --- incidents (add-incidents) ----------------------------------------------------------------------------


def test_add_incidents_shares_the_process_namespace_and_grants_only_sys_ptrace(
    base: list[Manifest], with_incidents: list[Manifest], existing_with_incidents: list[Manifest]
) -> None:
    before, after = find(base, "Deployment"), find(with_incidents, "Deployment")
    assert "shareProcessNamespace" not in pod_spec(before)
    assert pod_spec(after)["shareProcessNamespace"] is True
    security = container(after, SIDECAR)["securityContext"]
    assert security == {
        **container(before, SIDECAR)["securityContext"],
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},
    }
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    # Nothing else of the pod changes: vLLM's container, the init container, the volumes.
    for name in ("containers", "initContainers"):
        others = [item for item in pod_spec(after)[name] if item["name"] != SIDECAR]
        assert others == [item for item in pod_spec(before)[name] if item["name"] != SIDECAR]
    assert pod_spec(after)["volumes"] == pod_spec(before)["volumes"]
    # SYS_PTRACE is outside "baseline": the base's Namespace enforces "privileged", still warning on baseline.
    labels = find(with_incidents, "Namespace")["metadata"]["labels"]
    assert labels == {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/warn": "baseline",
        "pod-security.kubernetes.io/audit": "baseline",
    }
    # On a user's own Deployment, with no Namespace rendered, the same pod change and nothing more.
    mine = find(existing_with_incidents, "Deployment", "mistral-7b")
    assert pod_spec(mine)["shareProcessNamespace"] is True
    assert container(mine, SIDECAR)["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sorted(d["kind"] for d in existing_with_incidents) == ["Deployment", "Role", "RoleBinding", "ServiceAccount"]


def test_the_default_incidents_fit_the_sidecars_state_volume(base: list[Manifest]) -> None:
    """--incidents-keep x --incident-max-bytes, the most the incidents take, fits the emptyDir's sizeLimit (a
    volume over it gets the pod evicted), with room for the restart ledger."""
    deployment = find(base, "Deployment")
    state, _ = mount_volume(deployment, container(deployment, SIDECAR), Path("/var/lib/vllm-sidecar/x"))
    limit = state["emptyDir"]["sizeLimit"]
    assert limit.endswith("Mi")
    fields = Settings.model_fields
    incidents_bytes = fields["incidents_keep"].default * fields["incident_max_bytes"].default
    assert incidents_bytes + 2**20 <= int(limit[:-2]) * 2**20


def _probe_patch() -> Manifest:
    document: Manifest = yaml.safe_load((PROBE_COMPONENT_DIR / "probe.yaml").read_text())
    return document


def _without_probe(item: dict[str, Any]) -> dict[str, Any]:
    """A container of the rendered pod less the env entries and mounts add-probe's patch gives it."""
    (patched,) = (c for c in pod_spec(_probe_patch())["containers"] if c["name"] == item["name"])
    env = {e["name"] for e in patched.get("env", [])}
    mounts = {m["mountPath"] for m in patched.get("volumeMounts", [])}
    stripped = copy.deepcopy(item)
    stripped["env"] = [e for e in item.get("env", []) if e["name"] not in env]
    stripped["volumeMounts"] = [m for m in item.get("volumeMounts", []) if m["mountPath"] not in mounts]
    return {key: value for key, value in stripped.items() if value != []}  # a list emptied: no key


# --- the allocator probe (add-probe) ---------------------------------------------------------------------


def _plugin_folder() -> str:
    """Where the sidecar's image keeps the plugin: installed there with --target, copied to the final stage."""
    text = (REPO / "Dockerfile").read_text()
    target = re.search(r"--target (/\S+)", text)
    assert target is not None, "the Dockerfile installs the plugin folder with pip install --target"
    assert re.search(rf"^COPY --from=builder {re.escape(target[1])} {re.escape(target[1])}$", text, re.MULTILINE)
    return target[1]


def _probe_problems(deployment: Manifest, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    probe_dir = _sidecar_settings(container(deployment, SIDECAR), monkeypatch).probe_dir
    return probe_wiring_problems(
        deployment, sidecar_probe_dir=None if probe_dir is None else str(probe_dir), plugin_folder=_plugin_folder()
    )


def test_the_allocator_probe_is_wired(
    base: list[Manifest], existing_with_probe: list[Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same folder in both containers, named on both sides; the plugin from the sidecar's own image on
    vLLM's PYTHONPATH, read-only; in the complete example and on an existing Deployment alike."""
    reference_init = init_container(find(base, "Deployment"), PLUGIN_INIT)
    for rendered in (base, existing_with_probe):
        deployment = find(rendered, "Deployment")
        assert _probe_problems(deployment, monkeypatch) == []
        init, sidecar = init_container(deployment, PLUGIN_INIT), container(deployment, SIDECAR)
        assert init == reference_init
        # One image for both: an overlay's `images: newTag` moves the plugin with the sidecar.
        assert init["image"] == sidecar["image"] == f"{SIDECAR_IMAGE}:{__version__}"
        # As least privileged as the sidecar (its image's user; the copy needs nothing more).
        assert init["securityContext"] == sidecar["securityContext"]
        assert set(init["resources"]["limits"]) == {"cpu", "memory"}
        # The plugin loads in every vLLM process: nothing restricts the plugins here.
        assert "VLLM_PLUGINS" not in literal_env(container(deployment, "vllm"))


def _move_probe_dir_to_no_volume(deployment: Manifest) -> None:
    for name in (SIDECAR, "vllm"):
        _set_env(container(deployment, name), PROBE_DIR_ENV, "/tmp/probe")


@pytest.mark.parametrize(
    ("break_it", "problem"),
    [
        (lambda d: _set_env(container(d, SIDECAR), PROBE_DIR_ENV, "/run/elsewhere"), "the sidecar reads"),
        # Both sides agree on a path that no shared volume holds.
        (_move_probe_dir_to_no_volume, "not a volume"),
        (lambda d: _set_env(container(d, "vllm"), "PYTHONPATH", "/opt/other"), "PYTHONPATH '/opt/other' lacks"),
        (lambda d: _set_env(container(d, "vllm"), "VLLM_PLUGINS", "other_plugin"), "does not allow"),
        # vLLM compares the names exactly after splitting on commas: the space makes it another name.
        (lambda d: _set_env(container(d, "vllm"), "VLLM_PLUGINS", f"other, {PLUGIN_NAME}"), "does not allow"),
        (lambda d: init_container(d, PLUGIN_INIT).update(image="vllm-sidecar:other"), "the plugin comes from"),
        (lambda d: init_container(d, PLUGIN_INIT)["command"].__setitem__(2, "/opt/vllm-sidecar/."), "copies /opt"),
        (lambda d: _mount(container(d, "vllm"), PLUGIN_INIT).pop("readOnly"), "mounts the plugin folder writable"),
        (lambda d: _mount(container(d, SIDECAR), "vllm-probe").update(readOnly=True), "read-only"),
    ],
)
def test_the_probe_wiring_check_catches_a_break(
    base: list[Manifest], monkeypatch: pytest.MonkeyPatch, break_it: Any, problem: str
) -> None:
    """The check above, on copies of the base each broken in one place: it says so, and only that."""
    deployment = copy.deepcopy(find(base, "Deployment"))
    break_it(deployment)
    problems = _probe_problems(deployment, monkeypatch)
    assert len(problems) == 1, problems
    assert problem in problems[0]


def _set_env(item: dict[str, Any], name: str, value: str) -> None:
    item["env"] = [e for e in item.get("env", []) if e["name"] != name] + [{"name": name, "value": value}]


def _mount(item: dict[str, Any], volume: str) -> dict[str, Any]:
    (found,) = (m for m in item["volumeMounts"] if m["name"] == volume)
    result: dict[str, Any] = found
    return result


def test_add_probe_changes_only_what_the_probe_needs(
    existing: list[Manifest], existing_with_probe: list[Manifest]
) -> None:
    """On top of add-sidecar: vLLM's container gains two variables and two mounts and nothing else, the pod
    two emptyDirs and the init container; the rest is as add-sidecar left it."""
    before, after = find(existing, "Deployment"), find(existing_with_probe, "Deployment")
    vllm = container(after, "vllm")
    original = copy.deepcopy(vllm_container(before))
    original["name"] = "vllm"
    assert _without_probe(vllm) == original
    assert {e["name"] for e in vllm["env"]} - {e["name"] for e in original["env"]} == {PROBE_DIR_ENV, "PYTHONPATH"}
    assert _without_probe(container(after, SIDECAR)) == container(before, SIDECAR)
    added = [v for v in pod_spec(after)["volumes"] if v not in pod_spec(before)["volumes"]]
    assert added == pod_spec(_probe_patch())["volumes"]
    assert [c["name"] for c in pod_spec(after)["initContainers"]] == [PLUGIN_INIT]
    rest = {
        key: value for key, value in pod_spec(after).items() if key not in {"containers", "volumes", "initContainers"}
    }
    assert rest == {key: value for key, value in pod_spec(before).items() if key not in {"containers", "volumes"}}


def _readme_kustomizations() -> list[str]:
    """The kustomization.yaml examples of deploy/kubernetes/README.md, as written there."""
    text = (KUBERNETES_DIR / "README.md").read_text()
    return re.findall(r"```yaml\n(# my-vllm/kustomization\.yaml\n.*?)```", text, flags=re.DOTALL)


def _render_readme_example(text: str, folder: Path, files: dict[str, Path]) -> list[Manifest]:
    """Render one README example from `folder`/my-vllm, its ../deploy/kubernetes paths pointed at this repo."""
    overlay = folder / "my-vllm"
    overlay.mkdir()
    repo_kubernetes = os.path.relpath(KUBERNETES_DIR, overlay)
    (overlay / "kustomization.yaml").write_text(text.replace("../deploy/kubernetes", repo_kubernetes))
    for name, source in files.items():
        shutil.copy(source, overlay / name)
    return _render(overlay)


def test_readme_overlay_example_renders_and_keeps_the_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = _readme_kustomizations()
    assert len(examples) == 2, "README.md's two kustomization examples"
    rendered = _render_readme_example(examples[0], tmp_path, {})
    assert {d["metadata"].get("namespace", "ml-serving") for d in rendered} == {"ml-serving"}
    deployment = find(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    vllm, sidecar = container(deployment, "vllm"), container(deployment, SIDECAR)
    assert option(vllm["args"], "--model") == "meta-llama/Llama-3.1-8B-Instruct"
    _assert_the_drain_fits(deployment)
    settings = _sidecar_settings(sidecar, monkeypatch)
    assert settings.pause_kv_usage == 0.95
    assert (settings.actuator, settings.kubernetes_events) == ("kubernetes", True), "the other settings stay"
    assert find(rendered, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    validator = _kubernetes_validate()
    for document in rendered:
        if document["kind"] != "ServiceMonitor":
            validator.validate(document, SCHEMA_VERSIONS[-1], strict=True)


def test_readme_existing_deployment_example_renders(tmp_path: Path) -> None:
    rendered = _render_readme_example(
        _readme_kustomizations()[1], tmp_path, {"vllm-deployment.yaml": EXISTING_DEPLOYMENT}
    )
    deployment = find(rendered, "Deployment")
    assert container(deployment, SIDECAR)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert find(rendered, "RoleBinding")["subjects"][0]["namespace"] == "ml-serving"


# --- a real kube-apiserver ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    try:
        server = start_apiserver(tmp_path_factory.mktemp("kube-apiserver"))
    except UnavailableError as error:
        _unavailable(f"real kube-apiserver not available: {error}")
    except StartError as error:
        pytest.fail(f"kube-apiserver did not start: {error}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin(apiserver: ApiServer) -> Iterator[httpx.Client]:
    with apiserver.admin() as client:
        yield client


def _fresh_namespace() -> str:
    return f"t-{os.urandom(4).hex()}"


def _apply(admin: httpx.Client, documents: list[Manifest]) -> None:
    """Create every object the 1.20 server serves, as the admin, and check it kept every field sent."""
    served = [for_kubernetes_1_20(d) for d in documents if d["kind"] != "ServiceMonitor"]
    for document in sorted(served, key=lambda d: d["kind"] != "Namespace"):  # the namespace first
        stored = create(admin, document)
        assert dropped_fields(document, stored) == [], f"{document['kind']} {document['metadata']['name']}"


def test_base_is_accepted_by_a_real_apiserver(admin: httpx.Client, tmp_path: Path) -> None:
    """The base through a user's overlay that moves it to another namespace (kustomize renames the Namespace
    object and the RoleBinding's subject too)."""
    namespace = _fresh_namespace()
    rendered = _render_in(tmp_path, namespace, resources=[BASE_DIR])
    assert find(rendered, "Namespace")["metadata"]["name"] == namespace
    _apply(admin, rendered)
    stored = admin.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/vllm").json()
    assert container(stored, SIDECAR)["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_existing_deployment_with_the_component_is_accepted_by_a_real_apiserver(
    admin: httpx.Client, tmp_path: Path
) -> None:
    namespace = _fresh_namespace()
    admin.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()
    _apply(admin, _render_in(tmp_path, namespace, resources=[EXISTING_DEPLOYMENT], components=[COMPONENT_DIR]))


@pytest.mark.parametrize("container_name", ["vllm", "mistral-7b"])
def test_add_probe_on_an_existing_deployment_on_a_real_apiserver(
    admin: httpx.Client, tmp_path: Path, container_name: str
) -> None:
    """add-probe finds vLLM's container by its name, vllm. Named so, the pod is accepted with every field; named
    otherwise, the patch adds a container `vllm` without an image and the server refuses the Deployment, loudly
    (the component's comment says to copy it and change the name)."""
    namespace = _fresh_namespace()
    admin.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()
    source = tmp_path / "source" / EXISTING_DEPLOYMENT.name
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(_existing_named(container_name)))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rendered = _render_in(overlay, namespace, resources=[source], components=[COMPONENT_DIR, PROBE_COMPONENT_DIR])
    if container_name == "vllm":
        _apply(admin, rendered)
        return
    deployment = for_kubernetes_1_20(find(rendered, "Deployment", "mistral-7b"))
    (stray,) = (index for index, c in enumerate(pod_spec(deployment)["containers"]) if c["name"] == "vllm")
    assert "image" not in pod_spec(deployment)["containers"][stray]
    answer = admin.post(f"/apis/apps/v1/namespaces/{namespace}/deployments", json=deployment)
    assert answer.status_code == 422, answer.text
    assert f"spec.template.spec.containers[{stray}].image: Required value" in answer.json()["message"]


def _render_in(
    folder: Path, namespace: str, *, resources: list[Path], components: tuple[Path, ...] | list[Path] = ()
) -> list[Manifest]:
    try:
        return render_overlay(folder, namespace=namespace, resources=resources, components=components)
    except KubectlMissingError as error:
        _unavailable(str(error))


# Requests the adapter never makes, beside the ones it does: the Role must refuse all of them.
PROBED_RESOURCES = [
    ("", "pods"),
    ("", "pods/eviction"),
    ("", "pods/log"),
    ("", "pods/exec"),
    ("", "pods/status"),
    ("", "events"),
    ("", "secrets"),
    ("", "configmaps"),
    ("", "services"),
    ("", "serviceaccounts"),
    ("", "serviceaccounts/token"),
    ("apps", "deployments"),
    ("apps", "deployments/scale"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("policy", "poddisruptionbudgets"),
    ("events.k8s.io", "events"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
]
PROBED_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


def test_role_allows_exactly_the_requests_the_adapter_makes(admin: httpx.Client, tmp_path: Path) -> None:
    """Asked of the API server itself (SubjectAccessReview) for the pod's ServiceAccount: every request of
    every restart mode and of the Events is allowed in its namespace, and nothing else, there or elsewhere."""
    namespace = _fresh_namespace()
    rendered = _render_in(tmp_path, namespace, resources=[BASE_DIR])
    _apply(admin, [d for d in rendered if d["kind"] in {"Namespace", "ServiceAccount", "Role", "RoleBinding"}])
    account = pod_spec(find(rendered, "Deployment"))["serviceAccountName"]
    used = {(p.verb, p.resource, p.group) for needed in PERMISSIONS.values() for p in needed}
    used |= {(p.verb, p.resource, p.group) for p in EVENT_PERMISSIONS}
    used |= {(p.verb, p.resource, p.group) for p in LOG_PERMISSIONS}
    probed = {(verb, resource, group) for group, resource in PROBED_RESOURCES for verb in PROBED_VERBS}
    assert used <= probed, "every request the adapter makes is among those asked about"

    def may(verb: str, resource: str, group: str, where: str) -> bool:
        return service_account_may(
            admin,
            service_account=account,
            account_namespace=namespace,
            namespace=where,
            verb=verb,
            resource=resource,
            group=group,
        )

    allowed = {request for request in sorted(probed) if may(*request, namespace)}
    assert allowed == used
    elsewhere = [request for request in sorted(used) if may(*request, "default") or may(*request, "")]
    assert elsewhere == [], "only in its own namespace"


def test_the_remediation_role_allows_exactly_the_requests_of_the_flags_target(
    admin: httpx.Client, tmp_path: Path
) -> None:
    """add-remediation's Role alone (add-sidecar's left out: it may be cut down to a restart mode that needs none
    of this), asked of the API server for the pod's ServiceAccount: exactly what --remediate's flags target
    requests, in its namespace only."""
    namespace = _fresh_namespace()
    rendered = _render_in(tmp_path, namespace, resources=[BASE_DIR], components=[REMEDIATION_COMPONENT_DIR])
    remediation = [d for d in rendered if d["metadata"]["name"] == "vllm-sidecar-remediation"]
    assert sorted(d["kind"] for d in remediation) == ["Role", "RoleBinding"]
    _apply(admin, [d for d in rendered if d["kind"] in {"Namespace", "ServiceAccount"}] + remediation)
    account = pod_spec(find(rendered, "Deployment"))["serviceAccountName"]
    used = {(p.verb, p.resource, p.group) for p in FLAGS_PERMISSIONS}
    probed = {(verb, resource, group) for group, resource in PROBED_RESOURCES for verb in PROBED_VERBS}
    assert used <= probed

    def may(verb: str, resource: str, group: str, where: str) -> bool:
        return service_account_may(
            admin,
            service_account=account,
            account_namespace=namespace,
            namespace=where,
            verb=verb,
            resource=resource,
            group=group,
        )

    assert {request for request in sorted(probed) if may(*request, namespace)} == used
    assert [request for request in sorted(used) if may(*request, "default") or may(*request, "")] == []
