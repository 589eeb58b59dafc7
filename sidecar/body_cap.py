"""Reading an HTTP answer's body without letting it grow past a cap. Reads a network stream.

The body is counted as it streams, so an answer far larger than the cap (a 50 MB /metrics, a runaway API
server) costs at most the cap in memory and stops being read as soon as it is over.
"""

from __future__ import annotations

import httpx


class BodyTooLargeError(Exception):
    def __init__(self, limit_bytes: int) -> None:
        super().__init__(f"answer exceeds the {limit_bytes} byte cap")
        self.limit_bytes = limit_bytes


async def read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    """The whole body of a streamed `response`; `BodyTooLargeError` once it passes `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLargeError(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def send_capped(
    client: httpx.AsyncClient, request: httpx.Request, max_bytes: int, *, auth: httpx.Auth | None = None
) -> tuple[httpx.Response, bytes]:
    """Send `request` (with `auth` in place of the client's, when given) and read its answer's body capped."""
    if auth is None:
        response = await client.send(request, stream=True)
    else:
        response = await client.send(request, stream=True, auth=auth)
    try:
        return response, await read_capped(response, max_bytes)
    finally:
        await response.aclose()
