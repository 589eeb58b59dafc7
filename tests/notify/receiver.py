"""A loopback webhook receiver on the test's own event loop: records each request and answers as scripted.

A reply is a status code, `Reply(status, body, headers)`, or `HANG` (accept the request, never answer).
Each connection carries one request and is closed after the answer, so every retry is a new request.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


HANG: Final = "hang"
Script = int | Reply | str


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Receiver:
    def __init__(self, replies: list[Script] | None = None, *, default: Script = 200) -> None:
        self.replies = list(replies or [])
        self.default = default
        self.requests: list[Request] = []
        self.arrived = asyncio.Event()
        self._tasks: set[asyncio.Task[object]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.requests) < count:
                self.arrived.clear()
                await self.arrived.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up (a timeout on its side): what the test is about
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Request(method=method, path=path, headers=headers, body=body))
        self.arrived.set()
        script = self.replies.pop(0) if self.replies else self.default
        if script == HANG:
            await asyncio.Event().wait()  # until the client gives up or the receiver closes
        reply = script if isinstance(script, Reply) else Reply(int(script))
        extra = "".join(f"{name}: {value}\r\n" for name, value in reply.headers.items())
        status_line = f"HTTP/1.1 {reply.status} X\r\nContent-Length: {len(reply.body)}\r\nConnection: close\r\n"
        writer.write((status_line + extra + "\r\n").encode() + reply.body)
        await writer.drain()
