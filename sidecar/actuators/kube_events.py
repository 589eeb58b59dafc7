"""Kubernetes Events on the sidecar's own pod (`kubectl describe pod` shows them). Network I/O.

Each `emit` creates one core/v1 Event (count 1, first = last timestamp): the sidecar emits on transitions
(paused, resumed, restart started/completed/failed, budget exhausted), not per tick, so there is nothing
to aggregate and the Role needs only `create` on events. The pod's uid, which `kubectl describe` matches
events on, is read once (GET pod) and kept; when that read fails the Event goes out without it and the
read is tried again next time. An Event must never break a tick: `emit` never raises; the last error is
kept in `last_error` for /status and the log, and `send` returns it to callers that want it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.actuators import kube_bodies
from sidecar.actuators.kube_client import KubeClient, KubeTransportError
from sidecar.actuators.kube_names import KubeNameError, check_event_reason, check_label, check_subdomain
from sidecar.actuators.kube_permission import EVENT_PERMISSIONS, RequestFailedError, check_response

_GET_POD, CREATE_EVENT = EVENT_PERMISSIONS  # get: the pod uid, once


class KubernetesEvents:
    def __init__(
        self,
        client: KubeClient,
        *,
        pod: str,
        namespace: str,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.pod = check_subdomain(pod, what="pod name")
        self.namespace = check_label(namespace, what="namespace")
        self._client = client
        self._wall_clock_ns = wall_clock_ns
        self._pod_uid: str | None = None
        self.last_error: str | None = None

    async def emit(self, *, reason: str, message: str, warning: bool) -> None:
        """Create the Event; a failure is kept in `last_error`, never raised."""
        self.last_error = await self.send(reason=reason, message=message, warning=warning)

    async def send(self, *, reason: str, message: str, warning: bool) -> str | None:
        """Create the Event; None when it was created, else one line saying why not."""
        try:
            check_event_reason(reason)
            uid = await self._uid()
            body = kube_bodies.event(
                pod=self.pod,
                namespace=self.namespace,
                pod_uid=uid,
                reason=reason,
                message=message,
                warning=warning,
                wall_time_ns=self._wall_clock_ns(),
            )
            answer = await self._client.request("POST", f"/api/v1/namespaces/{self.namespace}/events", body=body)
            source = self._client.credentials.source
            check_response(answer, CREATE_EVENT, f"event {reason}", namespace=self.namespace, source=source, ok=(201,))
        except (RequestFailedError, KubeTransportError, KubeNameError) as error:
            return f"event {reason} not recorded: {error}"
        except Exception as error:  # noqa: BLE001 - an Event is best effort; it must never break a tick
            return f"event {reason} not recorded: unexpected {type(error).__name__}: {error}"
        return None

    async def close(self) -> None:
        await self._client.close()

    async def _uid(self) -> str | None:
        if self._pod_uid is None:
            try:
                answer = await self._client.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}")
            except KubeTransportError:
                return None  # the Event itself will then most likely fail too, and say why
            metadata = (answer.document or {}).get("metadata") if answer.status_code == 200 else None
            uid = metadata.get("uid") if isinstance(metadata, dict) else None
            self._pod_uid = uid if isinstance(uid, str) and uid else None
        return self._pod_uid
