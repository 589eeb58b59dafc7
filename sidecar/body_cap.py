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
