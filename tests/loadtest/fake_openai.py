"""A tiny OpenAI-like server on loopback for the load test's tests. Real HTTP/1.1 over real sockets.

It streams Server-Sent Events (chunked, as uvicorn does) with a usage chunk, serves `/v1/models`, a small
vLLM-like `/metrics` and `/health`, and records what it saw (prompts, arrival times, the most requests at
once). A test scripts it to answer slowly, fail every n-th request, or die mid-run (`kill`, or `die_at_request`:
the listening socket closes and every open connection is cut).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD_LIMIT_S = 15.0  # a client that queues requests never reaches the hold: the test fails after this long


@dataclass
class Behaviour:
    model: str = "fake-model"
    max_model_len: int | None = 4096
    first_token_delay_s: float = 0.0
    token_delay_s: float = 0.0
    fail_every: int = 0  # every n-th completion request answers HTTP 500
    usage: bool = True  # a usage chunk when the client asks for one
    stream: bool = True  # False: one JSON answer, as a server that ignores "stream" would
    error_after_tokens: int | None = None  # send an error event (code 500) after this many tokens
    garbage: bool = False  # an event that is not JSON
    metrics: bool = True
    kv_usage_ratio: float = 0.42
    preemptions_at_start: int = 5
    preemptions_per_request: int = 0
    die_at_request: int | None = None  # kill() when the n-th completion request arrives: a death mid-run by count
    piece_text: str = " tok"  # each streamed piece's text, written unescaped where JSON allows (as vLLM writes UTF-8)
    # Answer nothing until this many requests are in flight at once (for at most HOLD_LIMIT_S): proves a client
    # can have that many out together, whatever the box's speed lets overlap by chance.
    hold_until_in_flight: int | None = None
    # A keep-alive timeout that fires as a request arrives: a request on a connection idle for longer than this
    # is not answered and the connection closes (uvicorn's race, made certain). None: connections stay open.
    idle_close_s: float | None = None


@dataclass
class Seen:
    prompts: list[str] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)  # monotonic
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    dropped_on_idle: int = 0  # requests closed unanswered by Behaviour.idle_close_s


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # kill() cuts connections; nothing to wait for
    request_queue_size = 256

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake

    def handle_error(self, request: object, client_address: object) -> None:
        return  # a client that hung up, or a kill(): what the test is about, not noise


class FakeOpenAI:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.seen = Seen()
        self.lock = threading.Lock()
        self.killed = threading.Event()
        self.all_in = threading.Event()  # behaviour.hold_until_in_flight requests were in flight at once
        self.killed_at_s: float | None = None  # monotonic, when kill() began
        self.connections: set[socket.socket] = set()
        self.preemptions = self.behaviour.preemptions_at_start
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """Die like a crashed server: no more connections, the open ones cut mid-answer."""
        if self.killed.is_set():
            return
        self.killed_at_s = time.monotonic()
        self.killed.set()
        self._server.shutdown()
        self._server.server_close()
        with self.lock:
            open_connections = list(self.connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.kill()
        self._thread.join(timeout=5)

    def exposition(self) -> str:
        labels = f'engine="0",model_name="{self.behaviour.model}"'
        with self.lock:
            running, preemptions = self.seen.in_flight, self.preemptions
        return (
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {self.behaviour.kv_usage_ratio}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {running}\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            f"vllm:num_preemptions_total{{{labels}}} {float(preemptions)}\n"
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn: each event leaves at once, or TTFT would read 40 ms of Nagle
    server: _Server

    def setup(self) -> None:
        super().setup()
        self._answered_at: float | None = None  # monotonic, when this connection's last answer ended
        with self.server.fake.lock:
            self.server.fake.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.fake.lock:
            self.server.fake.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def handle_one_request(self) -> None:
        super().handle_one_request()
        self._answered_at = time.monotonic()

    def parse_request(self) -> bool:
        idle_close_s = self.server.fake.behaviour.idle_close_s
        answered_at = self._answered_at
        if idle_close_s is not None and answered_at is not None and time.monotonic() - answered_at > idle_close_s:
            with self.server.fake.lock:
                self.server.fake.seen.dropped_on_idle += 1
            self.close_connection = True  # no answer: the client reads "server disconnected"
            return False
        return super().parse_request()

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path == "/v1/models":
            model: dict[str, Any] = {"id": fake.behaviour.model, "object": "model"}
            if fake.behaviour.max_model_len is not None:
                model["max_model_len"] = fake.behaviour.max_model_len
            self._send(200, json.dumps({"object": "list", "data": [model]}).encode(), "application/json")
        elif self.path == "/health":
            self._send(200, b"", "text/plain")
        elif self.path == "/metrics" and fake.behaviour.metrics:
            self._send(200, fake.exposition().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def do_POST(self) -> None:
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        with fake.lock:
            fake.seen.requests += 1
            number = fake.seen.requests
            fake.seen.prompts.append(prompt)
            fake.seen.bodies.append(body)
            fake.seen.arrivals_s.append(time.monotonic())
            fake.seen.in_flight += 1
            fake.seen.max_in_flight = max(fake.seen.max_in_flight, fake.seen.in_flight)
            fake.preemptions += fake.behaviour.preemptions_per_request
            hold = fake.behaviour.hold_until_in_flight
            if hold is not None and fake.seen.in_flight >= hold:
                fake.all_in.set()
        if fake.behaviour.hold_until_in_flight is not None:
            fake.all_in.wait(HOLD_LIMIT_S)
        if number == fake.behaviour.die_at_request:
            fake.kill()  # this request, and every one in flight, is cut mid-answer
        try:
            if fake.behaviour.fail_every and number % fake.behaviour.fail_every == 0:
                error = {"error": {"message": "simulated failure", "type": "InternalServerError", "code": 500}}
                self._send(500, json.dumps(error).encode(), "application/json")
                return
            self._answer(body, prompt, chat=chat)
        finally:
            with fake.lock:
                fake.seen.in_flight -= 1

    def _answer(self, body: dict[str, Any], prompt: str, *, chat: bool) -> None:
        fake = self.server.fake
        behaviour = fake.behaviour
        tokens = int(body["max_tokens"])
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
        usage["total_tokens"] = usage["prompt_tokens"] + tokens
        if fake.killed.wait(behaviour.first_token_delay_s):
            return
        if not behaviour.stream:
            choice = {"index": 0, "finish_reason": "length"}
            choice.update(
                {"message": {"role": "assistant", "content": " tok" * tokens}} if chat else {"text": " tok" * tokens}
            )
            self._send(200, json.dumps({"choices": [choice], "usage": usage}).encode(), "application/json")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if behaviour.garbage:
            self._chunk(b"data: <html>oops</html>\n\n")
        for index in range(tokens):
            if index and fake.killed.wait(behaviour.token_delay_s):
                return
            if index == behaviour.error_after_tokens:
                self._event({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}})
                break
            finish = "length" if index == tokens - 1 else None
            piece = {"delta": {"content": behaviour.piece_text}} if chat else {"text": behaviour.piece_text}
            self._event({"choices": [{"index": 0, **piece, "finish_reason": finish}]})
        if behaviour.usage and body.get("stream_options", {}).get("include_usage"):
            self._event({"choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, chunk: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
