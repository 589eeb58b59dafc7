"""Who restarts vLLM's container, read from pod documents shaped as a kube-apiserver 1.20+ returns them.

The real API server serves the same documents in tests/actuators/test_kubernetes_apiserver.py; here every
state of the table in sidecar/actuators/kube_supervision.py, including those only a kubelet writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.actuators.kube_supervision import pod_supervision
from sidecar.model.supervision import Restarter


def pod(
    state: dict[str, Any] | None,
    *,
    policy: str | None = None,
    phase: str = "Running",
    name: str = "vllm",
    restarts: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    statuses = [] if state is None else [{"name": name, "state": state, "restartCount": restarts}]
    statuses.append({"name": "vllm-sidecar", "state": {"running": {}}, "restartCount": 0})
    spec: dict[str, Any] = {"containers": [{"name": "vllm"}, {"name": "vllm-sidecar"}]}
    if policy is not None:
        spec["restartPolicy"] = policy
    metadata: dict[str, Any] = {"name": "vllm-0"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T01:00:00Z"
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase, "containerStatuses": statuses}}


EXIT_0 = {"terminated": {"exitCode": 0, "reason": "Completed"}}
EXIT_1 = {"terminated": {"exitCode": 1, "reason": "Error"}}


@pytest.mark.parametrize(
    ("document", "restarter", "detail"),
    [
        (
            pod({"running": {"startedAt": "x"}}, restarts=2),
            Restarter.SUPERVISOR,
            "container vllm is running, 2 restarts: vLLM is starting",
        ),
        (
            pod({"waiting": {"reason": "CrashLoopBackOff"}}, restarts=5),
            Restarter.SUPERVISOR,
            "container vllm is CrashLoopBackOff, 5 restarts: the kubelet starts it",
        ),
        # A Deployment's pod (restartPolicy Always, the default): the kubelet restarts even an exit 0.
        (
            pod(EXIT_0),
            Restarter.SUPERVISOR,
            "container vllm ended (exit 0); restartPolicy Always: the kubelet restarts it",
        ),
        (
            pod(EXIT_1, policy="OnFailure"),
            Restarter.SUPERVISOR,
            "container vllm ended (exit 1); restartPolicy OnFailure: the kubelet restarts it",
        ),
        # vLLM exits 0 after its engine core died: under OnFailure nobody starts it again.
        (
            pod(EXIT_0, policy="OnFailure"),
            Restarter.SIDECAR,
            "container vllm ended (exit 0); restartPolicy OnFailure: the kubelet will not restart it",
        ),
        (
            pod(EXIT_1, policy="Never"),
            Restarter.SIDECAR,
            "container vllm ended (exit 1); restartPolicy Never: the kubelet will not restart it",
        ),
        (
            pod(EXIT_1, policy="Never", phase="Failed"),
            Restarter.SIDECAR,
            "the pod has ended (phase Failed): nothing restarts it",
        ),
        (pod(EXIT_0, deleting=True), Restarter.SUPERVISOR, "the pod is being deleted; its controller replaces it"),
        (pod(None, phase="Pending"), Restarter.SUPERVISOR, "the pod is pending: the kubelet is starting it"),
        (
            pod({"running": {}}, name="engine"),
            Restarter.UNKNOWN,
            "the pod reports no container 'vllm' (containers: engine, vllm-sidecar; see --vllm-container)",
        ),
        (pod({}), Restarter.UNKNOWN, "container vllm reports no state"),
        (
            {"kind": "Status"},
            Restarter.UNKNOWN,
            "the pod reports no container 'vllm' (containers: none; see --vllm-container)",
        ),
    ],
)
def test_the_sidecar_restarts_only_what_the_kubelet_will_not(
    document: dict[str, Any], restarter: Restarter, detail: str
) -> None:
    said = pod_supervision(document, "vllm")
    assert (said.restarter, said.detail) == (restarter, detail)
