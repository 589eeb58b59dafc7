"""A raw loopback HTTP server whose behaviour per path a test scripts: normal, slow, broken, huge.

Raw sockets rather than http.server, so a test can drop the connection mid-body or trickle bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.ports import free_port

Behaviour = Callable[[socket.socket], None]


def respond(status: int = 200, body: bytes = b"", content_type: str = "text/plain") -> Behaviour:
    def send(conn: socket.socket) -> None:
        head = f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)

    return send


def slow(delay_s: float, then: Behaviour) -> Behaviour:
    def send(conn: socket.socket) -> None:
        time.sleep(delay_s)
        then(conn)

    return send


def drop_mid_body(declared: int, sent: bytes) -> Behaviour:
    def send(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\n\r\n".encode() + sent)
        conn.shutdown(socket.SHUT_RDWR)

    return send


def endless(chunk: bytes, pause_s: float = 0.0, limit_bytes: int = 200 * 2**20) -> Behaviour:
    """A chunked body that keeps coming (up to a bound, so a broken client cannot make it run forever)."""

    def send(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        sent = 0
        try:
            while sent < limit_bytes:
                conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
                if pause_s:
                    time.sleep(pause_s)
        except OSError:
            return  # the client hung up: what a capped reader should do

    return send


@dataclass
class LoopbackServer:
    routes: dict[str, Behaviour] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = self._socket.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            path = data.split(b" ", 2)[1].decode()
            self.hits.append(path)
            behaviour = self.routes.get(path, respond(404, b"not found"))
            with contextlib.suppress(OSError):  # the client hung up first: its test decides what that means
                behaviour(conn)

    def close(self) -> None:
        self._stopped.set()
        self._socket.close()


def closed_port() -> int:
    """A port nothing listens on, to bind later or to find refused: outside the kernel's ephemeral range, so
    no other process's traffic takes it meanwhile (tests/ports.py)."""
    return free_port()


def vllm_stand_in(metrics: bytes) -> LoopbackServer:
    """A loopback vLLM 0.32 that serves `metrics` (a recorded exposition), its version, and /health 200."""
    server = LoopbackServer()
    server.routes.update(
        {"/metrics": respond(body=metrics), "/version": respond(body=b'{"version":"0.32.0"}'), "/health": respond()}
    )
    return server


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Await `predicate` on the loop, bounded: a real process is being waited for."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def nowhere_kubeconfig(folder: Path) -> Path:
    """A kubeconfig whose cluster nothing answers (127.0.0.1:1), context namespace `ml`: for what is built from
    it at start, before any request."""
    path = folder / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path
