"""A threaded loopback HTTP receiver that records every POST: stands in for a chat or paging webhook.

Threaded (not asyncio) so a synchronous end-to-end test can read what arrived while the services under test
post to it from other processes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                    )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return  # keep the test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Delivery]:
        with self._lock:
            return [delivery for delivery in self.deliveries if delivery.path == path]

    def wait_for(self, path: str, found: Callable[[list[Delivery]], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found(self.at(path)):
                return
            time.sleep(0.2)
        bodies = [delivery.body[:400] for delivery in self.at(path)]
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what} at {path}; got {bodies}")

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
