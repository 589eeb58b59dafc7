"""Who brings vLLM's container back, read from the own pod as the API server has it. Pure, no I/O.

The kubelet restarts a container that exits when the pod's `restartPolicy` says so: always under `Always` (every
Deployment), after a failure only under `OnFailure`, never under `Never`. vLLM exits 0 after its engine core
died, so under `OnFailure` nobody starts it again, and a pod that has ended (`Succeeded`, `Failed`) is not
restarted at all. Those are the cases the sidecar must act on itself (its restart makes the pod's controller
replace the pod); in every other case the kubelet is at it (a container running again, waiting in its
crash-loop back-off, being created) and the sidecar leaves it its `--down-after`.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.model.supervision import Restarter, Supervision
from sidecar.model.text import plural

_ENDED_PHASES = frozenset({"Succeeded", "Failed"})


def pod_supervision(pod: Mapping[str, object], container: str) -> Supervision:
    """What the pod document says about `container` (vLLM's): SIDECAR when nobody will start it again."""
    status = _mapping(pod.get("status"))
    phase = str(status.get("phase") or "")
    if _mapping(pod.get("metadata")).get("deletionTimestamp"):
        return Supervision(
            restarter=Restarter.SUPERVISOR, detail="the pod is being deleted; its controller replaces it"
        )
    if phase in _ENDED_PHASES:
        return Supervision(
            restarter=Restarter.SIDECAR, detail=f"the pod has ended (phase {phase}): nothing restarts it"
        )
    found = _container_status(status, container)
    if found is not None:
        policy = str(_mapping(pod.get("spec")).get("restartPolicy") or "Always")
        return _container_supervision(found, container, policy)
    if phase == "Pending":
        return Supervision(restarter=Restarter.SUPERVISOR, detail="the pod is pending: the kubelet is starting it")
    names = ", ".join(_names(status)) or "none"
    return Supervision(
        restarter=Restarter.UNKNOWN,
        detail=f"the pod reports no container {container!r} (containers: {names}; see --vllm-container)",
    )


def _container_supervision(found: Mapping[str, object], container: str, policy: str) -> Supervision:
    restarts = found.get("restartCount")
    count = f", {plural(restarts, 'restart')}" if isinstance(restarts, int) and restarts else ""
    state = _mapping(found.get("state"))
    said = f"container {container}"
    if "running" in state:
        return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{said} is running{count}: vLLM is starting")
    if "waiting" in state:
        reason = str(_mapping(state.get("waiting")).get("reason") or "waiting")
        return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{said} is {reason}{count}: the kubelet starts it")
    if "terminated" not in state:
        return Supervision(restarter=Restarter.UNKNOWN, detail=f"{said} reports no state")
    code = _mapping(state.get("terminated")).get("exitCode")
    ended = f"{said} ended (exit {code}){count}; restartPolicy {policy}"
    if policy == "Always" or (policy == "OnFailure" and code != 0):
        return Supervision(restarter=Restarter.SUPERVISOR, detail=f"{ended}: the kubelet restarts it")
    return Supervision(restarter=Restarter.SIDECAR, detail=f"{ended}: the kubelet will not restart it")


def _container_status(status: Mapping[str, object], container: str) -> Mapping[str, object] | None:
    for entry in _statuses(status):
        if entry.get("name") == container:
            return entry
    return None


def _names(status: Mapping[str, object]) -> list[str]:
    return [str(entry.get("name")) for entry in _statuses(status)]


def _statuses(status: Mapping[str, object]) -> list[Mapping[str, object]]:
    found = status.get("containerStatuses")
    return [entry for entry in found if isinstance(entry, Mapping)] if isinstance(found, list) else []


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}
