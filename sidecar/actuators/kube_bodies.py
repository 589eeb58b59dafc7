"""The request bodies the Kubernetes adapter sends, built from plain values. Pure, no I/O.

Kept apart so tests can check each one against the Kubernetes schemas (kubernetes-validate) and the
real API server without going through the adapter.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sidecar.actuators.kube_names import event_name

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
EVENT_COMPONENT = "vllm-sidecar"
EVENT_MESSAGE_MAX_CHARS = 1024  # the limit events.k8s.io enforces on a note; kept for core/v1 Events too


def rfc3339(wall_time_s: float) -> str:
    """Seconds since the epoch as RFC 3339 in UTC with second precision, as Kubernetes timestamps are."""
    return datetime.fromtimestamp(int(wall_time_s), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def eviction(
    pod: str, namespace: str, *, api_version: str = "policy/v1", grace_period_s: int | None
) -> dict[str, object]:
    """An Eviction of `pod` (policy/v1 from Kubernetes 1.22; policy/v1beta1 on older API servers)."""
    body: dict[str, object] = {
        "apiVersion": api_version,
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    }
    if grace_period_s is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace_period_s}
    return body


def restart_patch(wall_time_s: float) -> dict[str, object]:
    """The strategic merge patch `kubectl rollout restart` sends: a new restartedAt on the pod template."""
    return {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: rfc3339(wall_time_s)}}}}}


def flags_patch(
    *,
    resource_version: str,
    annotations: dict[str, str],
    container: str,
    args: list[str] | None,
) -> dict[str, object]:
    """The strategic merge patch of --remediate's write to a Deployment: its own annotations and, when given, the
    args of the container named `container` (matched by name; the list replaced whole). `resource_version` is
    the precondition: the API server answers 409 when the Deployment changed since it was read."""
    patch: dict[str, object] = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
    if args is not None:
        patch["spec"] = {"template": {"spec": {"containers": [{"name": container, "args": args}]}}}
    return patch


def event(
    *,
    pod: str,
    namespace: str,
    pod_uid: str | None,
    reason: str,
    message: str,
    warning: bool,
    wall_time_ns: int,
) -> dict[str, object]:
    """A core/v1 Event about the pod, named and stamped the way client-go's recorder does it."""
    stamp = rfc3339(wall_time_ns / 1e9)
    involved: dict[str, object] = {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace}
    if pod_uid:
        involved["uid"] = pod_uid
    if len(message) > EVENT_MESSAGE_MAX_CHARS:
        message = message[: EVENT_MESSAGE_MAX_CHARS - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod, wall_time_ns), "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": pod,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
