"""Restarts vLLM's pod through the Kubernetes API: evict it, delete it, or rollout-restart its Deployment. I/O.

- `evict` POSTs an Eviction (policy/v1; policy/v1beta1 when the API server predates 1.22 and says so), so
  PodDisruptionBudgets are honoured: a 429 is NOT_NOW, never forced. The pod's controller makes a new one.
- `delete` DELETEs the pod (optionally with a grace period); no budget is consulted.
- `rollout` does what `kubectl rollout restart` does: finds the Deployment through the pod's controller
  chain (Pod -> ReplicaSet -> Deployment, each hop checked by uid) and patches a new
  `kubectl.kubernetes.io/restartedAt` onto its pod template, so the Deployment's strategy replaces pods.

Names are validated when the adapter is built (and owner names as they come back), so nothing can address
another resource. Every refusal becomes one line: a 403 names the verb and resource the Role lacks. The
adapter never retries a restart and never raises; `dry_run` sends nothing. `PERMISSIONS` lists exactly
what each mode needs, and `deploy/kubernetes/add-sidecar/rbac.yaml` grants exactly that (a test holds them
together).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from lightkube.core.exceptions import ConfigError

from sidecar.actuators import kube_bodies
from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.actuators.kube_client import STRATEGIC_MERGE_PATCH, KubeClient, KubeResponse, KubeTransportError
from sidecar.actuators.kube_credentials import (
    SERVICE_ACCOUNT_DIR,
    CredentialsError,
    KubeCredentials,
    PodRef,
    in_cluster_credentials,
    kubeconfig_credentials,
    own_pod,
)
from sidecar.actuators.kube_events import KubernetesEvents
from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain
from sidecar.actuators.kube_permission import EVENT_PERMISSIONS, Permission, RequestFailedError, check_response
from sidecar.model.supervision import Restarter, Supervision

__all__ = ["EVENT_PERMISSIONS", "PERMISSIONS", "KubernetesActuator", "KubernetesEvents", "Mode", "connect"]


class Mode(StrEnum):
    EVICT = "evict"
    DELETE = "delete"
    ROLLOUT = "rollout"


GET_POD = Permission("get", "pods")
PERMISSIONS: Mapping[Mode, tuple[Permission, ...]] = {
    Mode.EVICT: (Permission("create", "pods/eviction"),),
    Mode.DELETE: (Permission("delete", "pods"),),
    Mode.ROLLOUT: (
        GET_POD,
        Permission("get", "replicasets", "apps"),
        Permission("get", "deployments", "apps"),
        Permission("patch", "deployments", "apps"),
    ),
}
_POLICY_V1, _POLICY_V1BETA1 = "policy/v1", "policy/v1beta1"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Owner:
    kind: str
    api_version: str
    name: str
    uid: str


class KubernetesActuator:
    name = "kubernetes"

    def __init__(
        self,
        mode: Mode | str,
        *,
        pod: str,
        namespace: str,
        client: KubeClient,
        grace_period_s: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            self.mode = Mode(mode)
        except ValueError:
            raise ValueError(f"kubernetes mode {mode!r} is not one of {', '.join(Mode)}") from None
        self.pod = check_subdomain(pod, what="pod name")
        self.namespace = check_label(namespace, what="namespace")
        if grace_period_s is not None and grace_period_s < 0:
            raise ValueError(f"grace period {grace_period_s} s is negative")
        self.grace_period_s = grace_period_s
        self._client = client
        self._clock = clock
        self._wall_clock = wall_clock
        self._eviction_api = _POLICY_V1

    async def supervision(self) -> Supervision:
        """The kubelet restarts a container that exits (restartPolicy Always, with its crash-loop backoff): left
        to it for --down-after; the sidecar acts only when it has not brought vLLM back by then."""
        return Supervision(restarter=Restarter.SUPERVISOR, detail="the kubelet restarts vLLM's container")

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        """One restart in this adapter's mode; `reason` is for the caller's log, the API carries none."""
        started = self._clock()
        if dry_run:
            return self._outcome(OutcomeStatus.DRY_RUN, self._would(), started)
        try:
            if self.mode is Mode.EVICT:
                detail = await self._evict()
            elif self.mode is Mode.DELETE:
                detail = await self._delete()
            else:
                detail = await self._rollout()
        except RequestFailedError as error:
            return self._outcome(error.status, str(error), started)
        except (KubeTransportError, KubeNameError) as error:
            return self._outcome(OutcomeStatus.FAILED, str(error), started)
        except Exception as error:  # noqa: BLE001 - an adapter reports a failure, it never raises into the loop
            return self._outcome(OutcomeStatus.FAILED, f"unexpected {type(error).__name__}: {error}", started)
        return self._outcome(OutcomeStatus.DONE, detail, started)

    async def close(self) -> None:
        await self._client.close()

    def _would(self) -> str:
        where = f"pod {self.pod} in namespace {self.namespace}"
        if self.mode is Mode.EVICT:
            return f"would evict {where} (policy/v1 Eviction)"
        if self.mode is Mode.DELETE:
            grace = "its own grace period" if self.grace_period_s is None else f"grace period {self.grace_period_s} s"
            return f"would delete {where} ({grace})"
        return f"would rollout-restart the Deployment that owns {where} (new {kube_bodies.RESTARTED_AT})"

    async def _evict(self) -> str:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/eviction"
        answer = await self._post_eviction(path)
        if self._eviction_api == _POLICY_V1 and _predates_policy_v1(answer):
            self._eviction_api = _POLICY_V1BETA1  # Kubernetes < 1.22 decodes no policy/v1 Eviction
            answer = await self._post_eviction(path)
        if answer.status_code == 429:
            if "DisruptionBudget" in answer.cause_reasons or "disruption budget" in answer.message:
                raise RequestFailedError(
                    OutcomeStatus.NOT_NOW,
                    f"a PodDisruptionBudget does not allow this eviction now ({answer.message})",
                )
            raise RequestFailedError(OutcomeStatus.NOT_NOW, f"the API server is throttling (429: {answer.message})")
        self._check(answer, PERMISSIONS[Mode.EVICT][0], self._target(), ok=(200, 201))
        return f"evicted pod {self.pod} in namespace {self.namespace} ({self._eviction_api} Eviction accepted)"

    async def _post_eviction(self, path: str) -> KubeResponse:
        body = kube_bodies.eviction(
            self.pod, self.namespace, api_version=self._eviction_api, grace_period_s=self.grace_period_s
        )
        return await self._client.request("POST", path, body=body)

    async def _delete(self) -> str:
        params = None if self.grace_period_s is None else {"gracePeriodSeconds": str(self.grace_period_s)}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}"
        answer = await self._client.request("DELETE", path, params=params)
        self._check(answer, PERMISSIONS[Mode.DELETE][0], self._target(), ok=(200, 202))
        grace = "" if self.grace_period_s is None else f", grace period {self.grace_period_s} s"
        return f"deleted pod {self.pod} in namespace {self.namespace}{grace}"

    async def _rollout(self) -> str:
        get_pod, get_rs, get_deploy, patch_deploy = PERMISSIONS[Mode.ROLLOUT]
        ns = self.namespace
        pod = await self._get(f"/api/v1/namespaces/{ns}/pods/{self.pod}", get_pod, self._target())
        owner = _controller(pod, "ReplicaSet", f"pod {self.pod}")
        rs_path = f"/apis/apps/v1/namespaces/{ns}/replicasets/{owner.name}"
        replica_set = await self._get(rs_path, get_rs, f"ReplicaSet {owner.name}", uid=owner.uid)
        owner = _controller(replica_set, "Deployment", f"ReplicaSet {owner.name}")
        path = f"/apis/apps/v1/namespaces/{ns}/deployments/{owner.name}"
        deployment = await self._get(path, get_deploy, f"Deployment {owner.name}", uid=owner.uid)
        now_s = self._wall_clock()
        patch = kube_bodies.restart_patch(now_s)
        answer = await self._client.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
        self._check(answer, patch_deploy, f"Deployment {owner.name}", ok=(200,))
        before, after = _generation(deployment), _generation(answer.document)
        stamp = kube_bodies.rfc3339(now_s)
        return (
            f"rollout restart of Deployment {owner.name} in namespace {ns} "
            f"(restartedAt {stamp}, generation {before} -> {after})"
        )

    async def _get(self, path: str, permission: Permission, what: str, *, uid: str | None = None) -> dict[str, object]:
        answer = await self._client.request("GET", path)
        self._check(answer, permission, what, ok=(200,))
        document = answer.document or {}
        found = _metadata(document).get("uid")
        if uid is not None and found != uid:
            raise RequestFailedError(
                OutcomeStatus.FAILED, f"{what} in namespace {self.namespace} was replaced (uid {found}, expected {uid})"
            )
        return document

    def _target(self) -> str:
        return f"pod {self.pod}"

    def _check(self, answer: KubeResponse, permission: Permission, what: str, *, ok: tuple[int, ...]) -> None:
        check_response(
            answer, permission, what, namespace=self.namespace, source=self._client.credentials.source, ok=ok
        )

    def _outcome(self, status: OutcomeStatus, detail: str, started: float) -> ActuatorOutcome:
        return ActuatorOutcome(status=status, detail=detail, duration_s=self._clock() - started)


def connect(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> tuple[KubeClient, PodRef]:
    """A client (in-cluster, or from `kubeconfig`) and the own pod from the downward API.

    Raises `CredentialsError` (one line) when either cannot be had; the shell turns it into exit code 2.
    """
    credentials: KubeCredentials = (
        in_cluster_credentials(env, service_account_dir)
        if kubeconfig is None
        else kubeconfig_credentials(kubeconfig, context=context)
    )
    pod = own_pod(env, namespace_fallback=credentials.namespace)
    try:  # lightkube loads the CA and client certificate here (and refuses what it cannot authenticate with)
        return KubeClient(credentials, timeout_s=timeout_s), pod
    except (ConfigError, OSError, ValueError) as error:  # ssl.SSLError is an OSError, binascii.Error a ValueError
        detail = " ".join(str(error).split()) or type(error).__name__
        raise CredentialsError(f"{credentials.source}: {detail}") from None


def _predates_policy_v1(answer: KubeResponse) -> bool:
    """The 400 a Kubernetes < 1.22 API server gives a policy/v1 Eviction (nothing was evicted)."""
    return answer.status_code == 400 and '"policy/v1"' in answer.message and "Eviction" in answer.message


def _metadata(document: Mapping[str, object] | None) -> Mapping[str, object]:
    metadata = (document or {}).get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _generation(document: Mapping[str, object] | None) -> int | None:
    generation = _metadata(document).get("generation")
    return generation if isinstance(generation, int) else None


def _controller(document: Mapping[str, object], kind: str, what: str) -> _Owner:
    """The owner with `controller: true`, which must be an apps/v1 `kind`; its name is validated."""
    references = _metadata(document).get("ownerReferences")
    for reference in references if isinstance(references, list) else []:
        if isinstance(reference, dict) and reference.get("controller") is True:
            owner = _Owner(
                kind=str(reference.get("kind", "")),
                api_version=str(reference.get("apiVersion", "")),
                name=str(reference.get("name", "")),
                uid=str(reference.get("uid", "")),
            )
            break
    else:
        raise RequestFailedError(
            OutcomeStatus.FAILED, f"{what} has no controller, so no Deployment to restart (use mode evict or delete)"
        )
    if owner.kind != kind or owner.api_version != "apps/v1":
        raise RequestFailedError(
            OutcomeStatus.FAILED,
            f"{what} is controlled by {owner.kind} {owner.name} ({owner.api_version}), not a {kind}: "
            "rollout restarts only Deployments (use mode evict or delete)",
        )
    check_subdomain(owner.name, what=f"{kind} name")
    return owner
