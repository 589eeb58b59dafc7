"""vLLM's command line from its container's spec in the sidecar's own pod (`GET pod`). Network I/O.

The fallback for a death's reading where the sidecar cannot see vLLM's processes in /proc (the pod shares no
process namespace): what the spec declares, read as `sidecar.parse.pod_command` allows. A pod's containers'
`command` and `args` never change in its life, so the first answer that holds the container is kept; a failed
request (no answer, a 403, the pod not found) says nothing and is asked again next time. The Role grants
`get pods` already (the Events' pod uid, rollout's owner chain).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.actuators.kube_client import KubeClient, KubeTransportError
from sidecar.model.server_command import ServerCommand
from sidecar.parse.pod_command import declared_command


class PodSpecCommand:
    def __init__(
        self,
        client: KubeClient,
        *,
        pod: str,
        namespace: str,
        container: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self.pod = pod
        self.namespace = namespace
        self.container = container
        self._wall_clock = wall_clock
        self._answered = False
        self._command: ServerCommand | None = None

    async def read(self) -> ServerCommand | None:
        """What the spec declares, or None where it does not say exactly; never raises."""
        if self._answered:
            return self._command
        try:
            answer = await self._client.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}")
        except KubeTransportError:
            return None
        if answer.status_code != 200 or answer.document is None:
            return None
        self._answered = True
        text = declared_command(answer.document, self.container)
        if text is not None:
            where = f"container {self.container}'s command in pod {self.pod}'s spec"
            self._command = ServerCommand(where=where, command=text, seen_wall_s=self._wall_clock())
        return self._command
