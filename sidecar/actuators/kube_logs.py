"""vLLM's log from the Kubernetes API: its container's log in the sidecar's own pod. Network I/O.

`GET /api/v1/namespaces/NS/pods/POD/log?container=vllm&tailLines=N&limitBytes=B`, and with
`previous=true` the container instance before the current one: when vLLM died and the kubelet restarted
its container, the instance that died is the previous one. The Role grants exactly `get` on `pods/log`
(`LOG_PERMISSIONS`, in deploy/kubernetes/add-sidecar/rbac.yaml).

Bounds: `tailLines` keeps the newest lines; `limitBytes` caps what the kubelet sends (it counts from the
first of those lines, so it is set well above the bytes kept, and only a log of absurdly long lines loses
its newest part to it); the last 256 KiB of what arrives are kept. The client's own deadline and the
caller's bound the time. Failures are one line: a 403 names the permission the Role lacks, a 400 for an
unknown container names the setting (`--vllm-container`).
"""

from __future__ import annotations

import asyncio

from sidecar.actuators.kube_client import KubeClient, KubeResponse, KubeTransportError
from sidecar.actuators.kube_names import check_label, check_subdomain
from sidecar.actuators.kube_permission import Permission, failure
from sidecar.actuators.log_source import MAX_LOG_BYTES, LogRead, LogRun, LogUnreadableError, Wanted

LOG_PERMISSION = Permission("get", "pods/log")
LOG_PERMISSIONS = (LOG_PERMISSION,)
DEFAULT_CONTAINER = "vllm"  # the vLLM container's name in deploy/kubernetes/base/vllm-deployment.yaml
TAIL_LINES = 5000
LIMIT_BYTES = 4 * MAX_LOG_BYTES


class PodLog:
    def __init__(
        self,
        client: KubeClient,
        *,
        pod: str,
        namespace: str,
        container: str = DEFAULT_CONTAINER,
        max_bytes: int = MAX_LOG_BYTES,
    ) -> None:
        self.pod = check_subdomain(pod, what="pod name")
        self.namespace = check_label(namespace, what="namespace")
        self.container = check_label(container, what="container name")
        self._client = client
        self._max_bytes = max_bytes

    @property
    def where(self) -> str:
        return f"log of container {self.container} in pod {self.pod}"

    def params(self, *, previous: bool) -> dict[str, str]:
        params = {"container": self.container, "tailLines": str(TAIL_LINES), "limitBytes": str(LIMIT_BYTES)}
        if previous:
            params["previous"] = "true"
        return params

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/log"

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        """The current instance's log and, when the one that died is wanted, the previous instance's."""
        del until_wall_s  # the API has no "until"; what came after is a new instance, told apart by `previous`
        if wanted is Wanted.DIED:
            current, previous = await asyncio.gather(self._get(previous=False), self._get(previous=True))
        else:
            current, previous = await self._get(previous=False), None
        runs: list[LogRun] = []
        if isinstance(previous, str):
            runs.append(LogRun(text=previous, label="previous instance", ended="its container was restarted"))
        if isinstance(current, str):
            runs.append(LogRun(text=current, label="current instance"))
        if not runs:
            assert isinstance(current, LogUnreadableError)  # noqa: S101 - _get gives text or this
            raise current
        return LogRead(where=self.where, runs=tuple(runs))

    async def _get(self, *, previous: bool) -> str | LogUnreadableError | None:
        """The log's tail; None when there is no previous instance; the error, to raise only if nothing came."""
        try:
            answer = await self._client.request("GET", self.path, params=self.params(previous=previous))
        except KubeTransportError as error:
            return LogUnreadableError(str(error))
        if answer.status_code in (200, 204):  # 204: nothing to read yet (a pod on no node has no log)
            return _tail(answer.body, self._max_bytes)
        if previous and answer.status_code == 400:
            return None  # "previous terminated container ... not found": it never restarted
        return LogUnreadableError(self._failure(answer))

    def _failure(self, answer: KubeResponse) -> str:
        what = f"the log of container {self.container} in pod {self.pod}"
        line = failure(answer, LOG_PERMISSION, what, namespace=self.namespace, source=self._client.credentials.source)
        if answer.status_code == 400 and "is not valid for pod" in answer.message:
            line += f"; set --vllm-container to the name of vLLM's container (now {self.container})"
        return line


def _tail(raw: bytes, max_bytes: int) -> str:
    if len(raw) > max_bytes:
        _, _, raw = raw[-max_bytes:].partition(b"\n")  # the line cut in two by the start of the tail
    return raw.decode("utf-8", errors="replace")
