"""Creates rendered manifests on the real kube-apiserver 1.20 (tests/actuators/kube_apiserver.py) and asks
it what a ServiceAccount may do. Does HTTP I/O, as the admin.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx

from tests.ship.kube_manifests import Manifest

# The kinds the manifests hold that the 1.20 server serves; the ServiceMonitor is a CRD it does not have.
PLURALS = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "Service": "services",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
}
CLUSTER_SCOPED = {"Namespace"}


def for_kubernetes_1_20(document: Manifest) -> Manifest:
    """The same object in an API version the 1.20 server serves.

    Only the PodDisruptionBudget needs it: policy/v1 came in Kubernetes 1.21, and 1.20 serves the same spec
    as policy/v1beta1. `unhealthyPodEvictionPolicy` (1.26+) does not exist there at all; it is taken out here
    rather than silently pruned by the server, and the schema tests check it against current versions.
    """
    if document["kind"] != "PodDisruptionBudget":
        return document
    converted = copy.deepcopy(document)
    assert converted["apiVersion"] == "policy/v1", converted["apiVersion"]
    converted["apiVersion"] = "policy/v1beta1"
    converted["spec"].pop("unhealthyPodEvictionPolicy", None)
    return converted


def collection_path(document: Manifest) -> str:
    api_version, kind = document["apiVersion"], document["kind"]
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind in CLUSTER_SCOPED:
        return f"{prefix}/{PLURALS[kind]}"
    return f"{prefix}/namespaces/{document['metadata']['namespace']}/{PLURALS[kind]}"


def create(admin: httpx.Client, document: Manifest) -> Manifest:
    """POST one object as the admin; the server's copy of it (defaults filled in) comes back."""
    answer = admin.post(collection_path(document), json=document)
    assert answer.status_code == 201, f"{document['kind']} {document['metadata']['name']}: {answer.text}"
    stored: Manifest = answer.json()
    return stored


def dropped_fields(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Where the server's copy lost or changed something that was sent. Servers add defaults but drop fields
    they do not know without a word (before 1.25), so this is how a field too new for the server shows up."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [f"{path}: sent an object, stored {stored!r}"]
        problems = []
        for key, value in sent.items():
            if key not in stored:
                problems.append(f"{path}.{key}: dropped")
            else:
                problems += dropped_fields(value, stored[key], f"{path}.{key}")
        return problems
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [f"{path}: sent {len(sent)} items, stored {stored!r}"]
        return [p for index, item in enumerate(sent) for p in dropped_fields(item, stored[index], f"{path}[{index}]")]
    # Quantities come back as strings (nvidia.com/gpu: 1 -> "1"); everything else as it was sent.
    same = sent == stored or (isinstance(sent, int) and not isinstance(sent, bool) and str(sent) == stored)
    return [] if same else [f"{path}: sent {sent!r}, stored {stored!r}"]


def service_account_may(
    admin: httpx.Client,
    *,
    service_account: str,
    account_namespace: str,
    namespace: str,
    verb: str,
    resource: str,
    group: str,
) -> bool:
    """The API server's own answer (a SubjectAccessReview) to: may this ServiceAccount do that there?
    `resource` may carry a subresource after '/' (pods/eviction)."""
    name, _, subresource = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{account_namespace}:{service_account}",
            # The groups the token authenticator gives every ServiceAccount.
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{account_namespace}", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": name,
                "subresource": subresource,
            },
        },
    }
    answer = admin.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
    assert answer.status_code == 201, answer.text
    return bool(answer.json()["status"].get("allowed", False))
