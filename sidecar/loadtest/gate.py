"""A readiness gate: hold new requests while a URL (the sidecar's /readyz) does not answer 200. Does I/O.

This is how traffic reaches vLLM in production: a Kubernetes Service, a gateway or a load balancer sends to
a pod only while its readiness check passes. The gate is polled in the background, so checking it costs a
request nothing; it starts open and stays open while the URL cannot be reached (a router falls back too).
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

POLL_INTERVAL_S = 0.25


class ReadinessGate:
    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url = url
        self._client = client
        self.open = True
        self.closed_polls = 0

    async def check(self) -> None:
        """Ask once (before the first request, as a router knows readiness before it routes)."""
        with contextlib.suppress(httpx.HTTPError):
            self.open = (await self._client.get(self.url, timeout=1.0)).status_code == httpx.codes.OK
        if not self.open:
            self.closed_polls += 1

    async def poll_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_INTERVAL_S):
                    await stop.wait()
