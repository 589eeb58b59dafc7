"""The Deployment that owns a pod, found through its controller chain: Pod -> ReplicaSet -> Deployment. Network I/O.

Each hop follows the ownerReference marked `controller: true`, which must name an apps/v1 object of the kind
expected, and the object read must carry that reference's uid: a ReplicaSet or Deployment deleted and made again
under the same name is not the owner. Owner names are validated before they go into a path. Two users: the
rollout restart (`kubernetes.py`) and --remediate's flags in the Deployment (`kube_flags.py`); each says in its
own words (`Unowned`) what a pod without such a chain means for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.kube_client import KubeClient, KubeResponse
from sidecar.actuators.kube_names import check_subdomain
from sidecar.actuators.kube_permission import RBAC_FILE, Permission, RequestFailedError, check_response

GET_POD = Permission("get", "pods")
GET_REPLICA_SET = Permission("get", "replicasets", "apps")
GET_DEPLOYMENT = Permission("get", "deployments", "apps")
CHAIN_PERMISSIONS = (GET_POD, GET_REPLICA_SET, GET_DEPLOYMENT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    kind: str
    api_version: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Unowned:
    """What a chain that ends in no Deployment means to the caller, appended to the one-line refusal."""

    missing: str  # after "pod P has no controller, so ": "no Deployment to restart (use mode evict or delete)"
    other: str  # after "... is controlled by StatefulSet S (apps/v1), not a ReplicaSet: "


@dataclass(frozen=True, slots=True, kw_only=True)
class OwningDeployment:
    name: str
    uid: str
    path: str  # the API path of the Deployment, for the request that follows
    document: dict[str, object]  # as read, uid checked


class KubeReader:
    """GETs in one namespace, each tied to the one permission it needs; any failure is a `RequestFailedError` with
    one line (a 403 names the verb and resource, and `rbac_file`, the manifest that grants it)."""

    def __init__(self, client: KubeClient, namespace: str, *, rbac_file: str = RBAC_FILE) -> None:
        self.client = client
        self.namespace = namespace
        self.rbac_file = rbac_file

    async def get(self, path: str, permission: Permission, what: str, *, uid: str | None = None) -> dict[str, object]:
        answer = await self.client.request("GET", path)
        self.check(answer, permission, what, ok=(200,))
        document = answer.document or {}
        found = metadata(document).get("uid")
        if uid is not None and found != uid:
            raise RequestFailedError(
                OutcomeStatus.FAILED, f"{what} in namespace {self.namespace} was replaced (uid {found}, expected {uid})"
            )
        return document

    def check(self, answer: KubeResponse, permission: Permission, what: str, *, ok: tuple[int, ...]) -> None:
        check_response(
            answer,
            permission,
            what,
            namespace=self.namespace,
            source=self.client.credentials.source,
            ok=ok,
            rbac_file=self.rbac_file,
        )


def deployment_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


async def owning_deployment(reader: KubeReader, pod: str, unowned: Unowned) -> OwningDeployment:
    """The Deployment that controls `pod`'s ReplicaSet, read. Raises `RequestFailedError` (one line), and
    `KubeTransportError` or `KubeNameError` as the client and the name checks do."""
    ns = reader.namespace
    document = await reader.get(f"/api/v1/namespaces/{ns}/pods/{pod}", GET_POD, f"pod {pod}")
    owner = controller(document, "ReplicaSet", f"pod {pod}", unowned)
    rs_path = f"/apis/apps/v1/namespaces/{ns}/replicasets/{owner.name}"
    replica_set = await reader.get(rs_path, GET_REPLICA_SET, f"ReplicaSet {owner.name}", uid=owner.uid)
    owner = controller(replica_set, "Deployment", f"ReplicaSet {owner.name}", unowned)
    path = deployment_path(ns, owner.name)
    deployment = await reader.get(path, GET_DEPLOYMENT, f"Deployment {owner.name}", uid=owner.uid)
    return OwningDeployment(name=owner.name, uid=owner.uid, path=path, document=deployment)


def metadata(document: Mapping[str, object] | None) -> Mapping[str, object]:
    found = (document or {}).get("metadata")
    return found if isinstance(found, dict) else {}


def controller(document: Mapping[str, object], kind: str, what: str, unowned: Unowned) -> Owner:
    """The owner with `controller: true`, which must be an apps/v1 `kind`; its name is validated."""
    references = metadata(document).get("ownerReferences")
    for reference in references if isinstance(references, list) else []:
        if isinstance(reference, dict) and reference.get("controller") is True:
            owner = Owner(
                kind=str(reference.get("kind", "")),
                api_version=str(reference.get("apiVersion", "")),
                name=str(reference.get("name", "")),
                uid=str(reference.get("uid", "")),
            )
            break
    else:
        raise RequestFailedError(OutcomeStatus.FAILED, f"{what} has no controller, so {unowned.missing}")
    if owner.kind != kind or owner.api_version != "apps/v1":
        raise RequestFailedError(
            OutcomeStatus.FAILED,
            f"{what} is controlled by {owner.kind} {owner.name} ({owner.api_version}), not a {kind}: {unowned.other}",
        )
    check_subdomain(owner.name, what=f"{kind} name")
    return owner
