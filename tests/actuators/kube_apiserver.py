"""A real kube-apiserver (v1.20.2) with etcd on free loopback ports, for the Kubernetes adapter's tests.

The binary comes gzipped in the shared tools folder beside the repository (`../shared/tools/`, or
`VLLM_SIDECAR_KUBE_APISERVER_GZ`); it is unpacked once into `${VLLM_SIDECAR_CACHE:-~/.cache/vllm-sidecar}`
under its sha256. etcd is Debian's `etcd-server`; `openssl` makes the keys. Authentication: a static admin
token (group system:masters) for fixtures, a static token for a test's exec credential plugin, service
account tokens minted through the TokenRequest API for the code under test, and client certificates signed
by a test CA; authorization: RBAC only.

What this server cannot do (no controller-manager, scheduler or kubelet): Deployments never make
ReplicaSets or pods (fixtures create them with ownerReferences by hand), pods stay Pending unless a test
patches their status, PodDisruptionBudget status is never computed (a Running pod under a PDB is always
429) and namespaces never finish deleting (each test gets a fresh one).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from sidecar.actuators.kube_credentials import KubeCredentials

REPO = Path(__file__).resolve().parents[2]
BINARY_GZ = "kube-apiserver-v1.20.2.gz"
BINARY_SHA256 = "6e030c63e1e20fc5b0b8d126eb4dc7fb6490d8f694997d2225f0adcced77c41e"
BINARY_ENV = "VLLM_SIDECAR_KUBE_APISERVER_GZ"
ADMIN_TOKEN = "admin-token"  # noqa: S105 - a test server's fixture token
EXEC_TOKEN = "exec-plugin-token"  # noqa: S105 - what the test's exec credential plugin hands out
EXEC_USER = "exec-user"
# What the test's identity provider hands out on a refresh: a JWT's shape, expiring in 2100, known to this
# API server as a static token (it verifies no signature; the client only reads `exp`).
OIDC_TOKEN = (
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9."
    + base64.urlsafe_b64encode(b'{"sub":"oidc-user","exp":4102444800}').decode().rstrip("=")
    + ".c2lnbmF0dXJl"
)
OIDC_USER = "oidc-user"
IMPERSONATOR_TOKEN = "impersonator-token"  # noqa: S105 - a user that may only act as others
IMPERSONATOR = "impersonator"
READY_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 3000


class UnavailableError(Exception):
    """Something the real API server needs is not installed here; the message says what and how to get it."""


class StartError(Exception):
    """The API server or etcd did not come up; the message carries the end of its log."""


def binary_gz() -> Path:
    candidates = [Path(os.environ[BINARY_ENV])] if os.environ.get(BINARY_ENV) else []
    candidates += [REPO.parent / "shared" / "tools" / BINARY_GZ, REPO / "shared" / "tools" / BINARY_GZ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise UnavailableError(f"{BINARY_GZ} not found (looked at {', '.join(map(str, candidates))}; or set {BINARY_ENV})")


def unpacked_binary(gz: Path) -> Path:
    """The executable, unpacked once per content into the cache (written aside, then renamed into place)."""
    digest = hashlib.sha256(gz.read_bytes()).hexdigest()
    if digest != BINARY_SHA256:
        raise StartError(f"{gz} has sha256 {digest}, expected {BINARY_SHA256} (a damaged or different file)")
    cache = Path(os.environ.get("VLLM_SIDECAR_CACHE") or Path.home() / ".cache" / "vllm-sidecar")
    target = cache / f"kube-apiserver-{digest[:16]}" / "kube-apiserver"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".kube-apiserver.{os.getpid()}")
        with gzip.open(gz) as source, partial.open("wb") as sink:
            shutil.copyfileobj(source, sink, 4 * 2**20)
        partial.chmod(0o755)
        partial.replace(target)
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass
class ApiServer:
    url: str
    folder: Path
    ca_file: Path  # the serving certificate's CA (the self-signed apiserver.crt holds the chain)
    client_ca_key: Path
    client_ca_cert: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    startup_s: float = 0.0

    def admin(self) -> httpx.Client:
        verify = ssl.create_default_context(cafile=self.ca_file)
        return httpx.Client(base_url=self.url, verify=verify, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    def client_certificate(self, user: str) -> tuple[str, str]:
        """A PEM certificate and key for `user`, signed by the CA the API server trusts for clients."""
        key, csr, cert = (self.folder / f"{user}.{suffix}" for suffix in ("key", "csr", "crt"))
        openssl("ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", str(key))
        openssl("req", "-new", "-key", str(key), "-subj", f"/CN={user}", "-out", str(csr))
        openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.client_ca_cert), "-CAkey", str(self.client_ca_key),
            "-CAcreateserial", "-days", "1", "-out", str(cert),
        )  # fmt: skip
        return cert.read_text(), key.read_text()

    def log_tail(self) -> str:
        parts = []
        for name in ("etcd.log", "apiserver.log"):
            path = self.folder / name
            text = path.read_text(errors="replace") if path.is_file() else ""
            parts.append(f"--- {name}\n{text[-LOG_TAIL_CHARS:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for process in reversed(self.processes):  # the API server first, then etcd
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def start_apiserver(folder: Path) -> ApiServer:
    """etcd and kube-apiserver on free loopback ports; returns once /readyz answers ok."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise UnavailableError("etcd not installed (apt-get install -y --no-install-recommends etcd-server)")
    if shutil.which("openssl") is None:
        raise UnavailableError("openssl not installed (apt-get install -y openssl)")
    binary = unpacked_binary(binary_gz())
    started = time.monotonic()
    pki = folder / "pki"
    pki.mkdir(parents=True)
    openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    client_ca_key, client_ca_cert = pki / "client-ca.key", pki / "client-ca.crt"
    openssl("ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", str(client_ca_key))
    openssl("req", "-x509", "-new", "-key", str(client_ca_key), "-subj", "/CN=test-client-ca", "-days", "1",
            "-out", str(client_ca_cert))  # fmt: skip
    (folder / "tokens.csv").write_text(
        f'{ADMIN_TOKEN},admin,1,"system:masters"\n{EXEC_TOKEN},{EXEC_USER},3,\n'
        f"{OIDC_TOKEN},{OIDC_USER},4,\n{IMPERSONATOR_TOKEN},{IMPERSONATOR},5,\n"
    )
    client_port, peer_port, secure_port = free_port(), free_port(), free_port()
    etcd_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    server = ApiServer(
        url=f"https://127.0.0.1:{secure_port}",
        folder=folder,
        ca_file=pki / "apiserver.crt",
        client_ca_key=client_ca_key,
        client_ca_cert=client_ca_cert,
    )
    etcd_args = [
        etcd, "--name", "kapi", "--data-dir", str(folder / "etcd"),
        "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"kapi={peer_url}", "--unsafe-no-fsync",
    ]  # fmt: skip
    apiserver_args = [
        str(binary), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
        f"--secure-port={secure_port}", "--insecure-port=0", f"--cert-dir={pki}",
        f"--token-auth-file={folder / 'tokens.csv'}", f"--client-ca-file={client_ca_cert}",
        "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.0.0.0/24", "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
    ]  # fmt: skip
    try:
        for args, log in ((etcd_args, "etcd.log"), (apiserver_args, "apiserver.log")):
            with (folder / log).open("wb") as sink:
                server.processes.append(subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, cwd=folder))
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - started
    return server


def _wait_ready(server: ApiServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for process in server.processes:
            if process.poll() is not None:
                name = Path(str(process.args[0])).name  # type: ignore[index]  # args is the list given to Popen
                raise StartError(f"{name} exited with {process.returncode}\n{server.log_tail()}")
        if server.ca_file.is_file():
            with contextlib.suppress(httpx.HTTPError, OSError), server.admin() as admin:  # OSError: TLS, cert
                if admin.get("/readyz", timeout=2).text == "ok":
                    return
        time.sleep(0.2)
    raise StartError(f"kube-apiserver not ready within {READY_TIMEOUT_S:g} s\n{server.log_tail()}")


RBAC_FILE = REPO / "deploy" / "kubernetes" / "add-sidecar" / "rbac.yaml"
REMEDIATION_RBAC_FILE = REPO / "deploy" / "kubernetes" / "add-remediation" / "rbac.yaml"
SERVICE_ACCOUNT = "vllm-sidecar"
LABELS = {"app": "vllm"}
POD_SPEC = {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]}


def rbac_documents(path: Path = RBAC_FILE) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def without_permission(role: dict[str, Any], verb: str, resource: str, group: str) -> dict[str, Any]:
    """A copy of the Role with `verb` on `group`/`resource` taken out (and rules left with no verb dropped)."""
    rules = []
    for rule in role["rules"]:
        matches = resource in rule["resources"] and group in rule["apiGroups"]
        verbs = [v for v in rule["verbs"] if not (matches and v == verb)]
        if verbs:
            rules.append({**rule, "verbs": verbs})
    return {**role, "rules": rules}


@dataclass
class Workspace:
    """A fresh namespace holding rbac.yaml's ServiceAccount, Role and RoleBinding and a Deployment's pod."""

    server: ApiServer
    admin: httpx.Client
    namespace: str
    deployment: str = "vllm"
    replica_set: str = "vllm-7d4b9c8f6"
    pod: str = "vllm-7d4b9c8f6-x2k9p"
    uids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, server: ApiServer, admin: httpx.Client) -> Workspace:
        namespace = f"t-{os.urandom(4).hex()}"
        cls._ok(admin.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}))
        return cls(server=server, admin=admin, namespace=namespace)

    @staticmethod
    def _ok(response: httpx.Response) -> dict[str, Any]:
        assert response.is_success, f"{response.request.method} {response.request.url.path}: {response.text}"
        document: dict[str, Any] = response.json()
        return document

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._ok(self.admin.post(path.format(ns=self.namespace), json=body))

    def get(self, path: str) -> httpx.Response:
        return self.admin.get(path.format(ns=self.namespace))

    def apply_rbac(
        self,
        *,
        without: tuple[str, str, str] | None = None,
        user: str | None = None,
        files: tuple[Path, ...] = (RBAC_FILE,),
    ) -> None:
        """The RBAC files as shipped (each Role less one verb when asked); `user` is bound to the Roles too."""
        granted: list[tuple[str, str, str]] = []  # one rule of each Role, to wait for
        for shipped in (document for path in files for document in rbac_documents(path)):
            kind = shipped["kind"]
            document = without_permission(shipped, *without) if kind == "Role" and without is not None else shipped
            if kind == "RoleBinding" and user is not None:
                document["subjects"].append({"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"})
            plural = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}[kind]
            prefix = "/api/v1" if kind == "ServiceAccount" else "/apis/rbac.authorization.k8s.io/v1"
            self.post(f"{prefix}/namespaces/{{ns}}/{plural}", document)
            if kind == "Role":
                granted.append(
                    next(
                        (rule["verbs"][0], rule["resources"][0], rule["apiGroups"][0])
                        for rule in document["rules"]
                        if rule["verbs"] and "/" not in rule["resources"][0]
                    )
                )
        account = f"system:serviceaccount:{self.namespace}:{SERVICE_ACCOUNT}"
        for subject in (account,) if user is None else (account, user):
            for verb, resource, group in granted:
                self.wait_until_allowed(subject, verb, resource, group=group)

    def wait_until_allowed(
        self, user: str, verb: str, resource: str, *, group: str = "", name: str | None = None
    ) -> None:
        """Until the API server's authorizer lets `user` do it: RBAC reads Roles and bindings from an informer
        cache, so a binding just created takes effect some milliseconds later (a test that acts at once races
        it). Asks the same authorizer through a SubjectAccessReview; at most 10 s."""
        attributes: dict[str, str] = {"namespace": self.namespace, "verb": verb, "resource": resource, "group": group}
        if name is not None:
            attributes["name"] = name
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": attributes},
        }
        deadline = time.monotonic() + 10.0
        while not self._ok(self.admin.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review))[
            "status"
        ].get("allowed", False):
            assert time.monotonic() < deadline, f"{user} still may not {verb} {resource} after 10 s"
            time.sleep(0.02)

    def sidecar_token(self) -> str:
        """A bound token of the vllm-sidecar ServiceAccount, as the kubelet projects into the pod."""
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        }
        answer = self.post(f"/api/v1/namespaces/{{ns}}/serviceaccounts/{SERVICE_ACCOUNT}/token", request)
        token: str = answer["status"]["token"]
        return token

    def create_workload(self, pod_spec: dict[str, Any] | None = None) -> None:
        """Deployment -> ReplicaSet -> Pod, linked by controller ownerReferences as the controllers would."""
        spec_of_pod = POD_SPEC if pod_spec is None else pod_spec
        template = {"metadata": {"labels": LABELS}, "spec": spec_of_pod}
        spec = {"replicas": 1, "selector": {"matchLabels": LABELS}, "template": template}
        deployment = self.post(
            "/apis/apps/v1/namespaces/{ns}/deployments", {"metadata": {"name": self.deployment}, "spec": spec}
        )
        self.uids["deployment"] = deployment["metadata"]["uid"]
        owner = self._owner("Deployment", self.deployment, deployment)
        metadata = {"name": self.replica_set, "labels": LABELS, "ownerReferences": [owner]}
        replica_set = self.post("/apis/apps/v1/namespaces/{ns}/replicasets", {"metadata": metadata, "spec": spec})
        self.uids["replica_set"] = replica_set["metadata"]["uid"]
        owner = self._owner("ReplicaSet", self.replica_set, replica_set)
        metadata = {"name": self.pod, "labels": LABELS, "ownerReferences": [owner]}
        pod = self.post("/api/v1/namespaces/{ns}/pods", {"metadata": metadata, "spec": spec_of_pod})
        self.uids["pod"] = pod["metadata"]["uid"]

    @staticmethod
    def _owner(kind: str, name: str, document: dict[str, Any]) -> dict[str, Any]:
        uid = document["metadata"]["uid"]
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def pod_exists(self) -> bool:
        answer = self.get(f"/api/v1/namespaces/{{ns}}/pods/{self.pod}")
        assert answer.status_code in (200, 404), answer.text
        return answer.status_code == 200

    def set_pod_running(self) -> None:
        """What a kubelet would report; the admin patches the status subresource."""
        patch = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/status"
        self._ok(self.admin.patch(path, content=json.dumps(patch), headers=headers))

    def create_pdb(self) -> None:
        spec = {"minAvailable": 1, "selector": {"matchLabels": LABELS}}
        self.post(
            "/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets", {"metadata": {"name": "vllm"}, "spec": spec}
        )

    def deployment_document(self) -> dict[str, Any]:
        return self._ok(self.get(f"/apis/apps/v1/namespaces/{{ns}}/deployments/{self.deployment}"))

    def events(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._ok(self.get("/api/v1/namespaces/{ns}/events"))["items"]
        return items

    def credentials(self, token: str) -> KubeCredentials:
        return token_credentials(self.server.url, token, ca_file=self.server.ca_file)


def token_credentials(
    server: str, token: str | None = None, *, ca_file: Path | None = None, source: str = "test token", **user: Any
) -> KubeCredentials:
    """Credentials for `server` with a bearer token (or the lightkube `User` fields given), as a kubeconfig gives."""
    cluster = Cluster(server=server, certificate_auth=None if ca_file is None else str(ca_file))
    config = KubeConfig.from_one(cluster=cluster, user=User(token=token, **user)).get()
    assert config is not None
    return KubeCredentials(config=config, source=source)
