"""Restarts vLLM's pod through the Kubernetes API: evict it, delete it, or rollout-restart its Deployment. I/O.

- `evict` POSTs an Eviction (policy/v1; policy/v1beta1 when the API server predates 1.22 and says so), so
  PodDisruptionBudgets are honoured: a 429 is NOT_NOW, never forced. The pod's controller makes a new one.
- `delete` DELETEs the pod (optionally with a grace period); no budget is consulted.
- A hard restart (a dead or hung engine, which cannot answer SIGTERM) asks for a grace period of 1 s in both:
  the kubelet kills at once instead of waiting out `terminationGracePeriodSeconds`, and still removes the pod
  only once its containers are gone, so the new pod never starts beside the old one's GPU memory. (0 would be
  a forced deletion, which does not wait for that.) A rollout follows the Deployment's own strategy.
- `rollout` does what `kubectl rollout restart` does: finds the Deployment through the pod's controller
  chain (Pod -> ReplicaSet -> Deployment, each hop checked by uid: `kube_owner`) and patches a new
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
from sidecar.actuators.kube_owner import (
    CHAIN_PERMISSIONS,
    GET_POD,
    KubeReader,
    Unowned,
    metadata,
    owning_deployment,
)
from sidecar.actuators.kube_permission import EVENT_PERMISSIONS, Permission, RequestFailedError
from sidecar.actuators.kube_supervision import pod_supervision
from sidecar.model.supervision import Restarter, Supervision

__all__ = [
    "EVENT_PERMISSIONS",
    "PERMISSIONS",
    "SUPERVISION_PERMISSIONS",
    "KubernetesActuator",
    "KubernetesEvents",
    "Mode",
    "connect",
]


class Mode(StrEnum):
    EVICT = "evict"
    DELETE = "delete"
    ROLLOUT = "rollout"


PERMISSIONS: Mapping[Mode, tuple[Permission, ...]] = {
    Mode.EVICT: (Permission("create", "pods/eviction"),),
    Mode.DELETE: (Permission("delete", "pods"),),
    Mode.ROLLOUT: (*CHAIN_PERMISSIONS, Permission("patch", "deployments", "apps")),
}
SUPERVISION_PERMISSIONS = (GET_POD,)  # reading vLLM's container state while vLLM is gone
HARD_GRACE_PERIOD_S = 1
_POLICY_V1, _POLICY_V1BETA1 = "policy/v1", "policy/v1beta1"
_UNOWNED = Unowned(
    missing="no Deployment to restart (use mode evict or delete)",
    other="rollout restarts only Deployments (use mode evict or delete)",
)


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
        vllm_container: str = "vllm",
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
        self.vllm_container = vllm_container
        self._client = client
        self._reader = KubeReader(client, self.namespace)
        self._clock = clock
        self._wall_clock = wall_clock
        self._eviction_api = _POLICY_V1

    async def supervision(self) -> Supervision:
        """Read from the own pod: the kubelet restarts vLLM's container unless the pod's restartPolicy says not
        to (`Never`, or `OnFailure` after vLLM's exit 0) or the pod has ended. UNKNOWN when the pod cannot be
        read (the policy then gives the kubelet its whole --down-after)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}"
        try:
            document = await self._reader.get(path, GET_POD, self._target())
        except (RequestFailedError, KubeTransportError) as error:
            return Supervision(restarter=Restarter.UNKNOWN, detail=f"cannot read the pod: {error}")
        except Exception as error:  # noqa: BLE001 - never raises into the poll loop
            return Supervision(restarter=Restarter.UNKNOWN, detail=f"cannot read the pod: {type(error).__name__}")
        return pod_supervision(document, self.vllm_container)

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        """One restart in this adapter's mode; `reason` is for the caller's log, the API carries none."""
        started = self._clock()
        grace_s = self._grace_period_s(hard=hard)
        if dry_run:
            return self._outcome(OutcomeStatus.DRY_RUN, self._would(grace_s), started)
        try:
            if self.mode is Mode.EVICT:
                detail = await self._evict(grace_s)
            elif self.mode is Mode.DELETE:
                detail = await self._delete(grace_s)
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

    def _grace_period_s(self, *, hard: bool) -> int | None:
        """The configured grace period; for a hard restart at most `HARD_GRACE_PERIOD_S`."""
        if not hard:
            return self.grace_period_s
        return HARD_GRACE_PERIOD_S if self.grace_period_s is None else min(self.grace_period_s, HARD_GRACE_PERIOD_S)

    def _would(self, grace_s: int | None) -> str:
        where = f"pod {self.pod} in namespace {self.namespace}"
        grace = "its own grace period" if grace_s is None else f"grace period {grace_s} s"
        if self.mode is Mode.EVICT:
            return f"would evict {where} (policy/v1 Eviction, {grace})"
        if self.mode is Mode.DELETE:
            return f"would delete {where} ({grace})"
        return f"would rollout-restart the Deployment that owns {where} (new {kube_bodies.RESTARTED_AT})"

    async def _evict(self, grace_s: int | None) -> str:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/eviction"
        answer = await self._post_eviction(path, grace_s)
        if self._eviction_api == _POLICY_V1 and _predates_policy_v1(answer):
            self._eviction_api = _POLICY_V1BETA1  # Kubernetes < 1.22 decodes no policy/v1 Eviction
            answer = await self._post_eviction(path, grace_s)
        if answer.status_code == 429:
            if "DisruptionBudget" in answer.cause_reasons or "disruption budget" in answer.message:
                raise RequestFailedError(
                    OutcomeStatus.NOT_NOW,
                    f"a PodDisruptionBudget does not allow this eviction now ({answer.message})",
                )
            raise RequestFailedError(OutcomeStatus.NOT_NOW, f"the API server is throttling (429: {answer.message})")
        self._check(answer, PERMISSIONS[Mode.EVICT][0], self._target(), ok=(200, 201))
        grace = "" if grace_s is None else f", grace period {grace_s} s"
        return f"evicted pod {self.pod} in namespace {self.namespace} ({self._eviction_api} Eviction accepted{grace})"

    async def _post_eviction(self, path: str, grace_s: int | None) -> KubeResponse:
        body = kube_bodies.eviction(self.pod, self.namespace, api_version=self._eviction_api, grace_period_s=grace_s)
        return await self._client.request("POST", path, body=body)

    async def _delete(self, grace_s: int | None) -> str:
        params = None if grace_s is None else {"gracePeriodSeconds": str(grace_s)}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}"
        answer = await self._client.request("DELETE", path, params=params)
        self._check(answer, PERMISSIONS[Mode.DELETE][0], self._target(), ok=(200, 202))
        grace = "" if grace_s is None else f", grace period {grace_s} s"
        return f"deleted pod {self.pod} in namespace {self.namespace}{grace}"

    async def _rollout(self) -> str:
        patch_deploy = PERMISSIONS[Mode.ROLLOUT][-1]
        deployment = await owning_deployment(self._reader, self.pod, _UNOWNED)
        now_s = self._wall_clock()
        patch = kube_bodies.restart_patch(now_s)
        answer = await self._client.request("PATCH", deployment.path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
        self._check(answer, patch_deploy, f"Deployment {deployment.name}", ok=(200,))
        before, after = _generation(deployment.document), _generation(answer.document)
        stamp = kube_bodies.rfc3339(now_s)
        return (
            f"rollout restart of Deployment {deployment.name} in namespace {self.namespace} "
            f"(restartedAt {stamp}, generation {before} -> {after})"
        )

    def _target(self) -> str:
        return f"pod {self.pod}"

    def _check(self, answer: KubeResponse, permission: Permission, what: str, *, ok: tuple[int, ...]) -> None:
        self._reader.check(answer, permission, what, ok=ok)

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


def _generation(document: Mapping[str, object] | None) -> int | None:
    generation = metadata(document).get("generation")
    return generation if isinstance(generation, int) else None
