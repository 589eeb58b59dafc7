"""A loopback stand-in for a vLLM API server that serves fixed documents. Does network I/O (a thread).

It answers the way a real vLLM 0.32 does (checked against one in tests/e2e), since that decides what a poll
costs the sidecar: HTTP/1.1 with keep-alive closed after 5 s idle (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and
/metrics uncompressed with a Content-Length whatever the request accepts (vLLM's /metrics route is
prometheus-fastapi-instrumentator's, which does not gzip by default).
"""

from __future__ import annotations

import http.server
import re
import threading
from collections import Counter
from dataclasses import dataclass, field

KEEP_ALIVE_S = 5.0
METRICS_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"  # what vLLM 0.32 sends
# The counters the sidecar follows for progress and rates, advanced on every scrape as an engine at work does
# (a frozen exposition is a hung engine: the daemon would pause admission, and be measured paused).
_PROGRESS_LINE = re.compile(
    r"^((?:vllm:generation_tokens_total|vllm:prompt_tokens_total|vllm:iteration_tokens_total_count|"
    r"vllm:prefix_cache_queries_total|vllm:prefix_cache_hits_total)(?:\{[^}\n]*\})? )([0-9.e+]+)$",
    re.MULTILINE,
)
TOKENS_PER_SCRAPE = 500.0


def advanced(metrics: bytes, scrapes: int) -> bytes:
    """`metrics` as it reads after `scrapes` more scrapes of a busy engine: its progress counters moved on."""
    if scrapes == 0:
        return metrics

    def move(line: re.Match[str]) -> str:
        return f"{line.group(1)}{float(line.group(2)) + scrapes * TOKENS_PER_SCRAPE!r}"

    return _PROGRESS_LINE.sub(move, metrics.decode()).encode()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        return  # a daemon stopping resets its connections: nothing to report


@dataclass(slots=True)
class StandIn:
    metrics: bytes
    gpu_document: bytes | None = None  # served at /sim/gpu when set (the simulator's GPU endpoint)
    hits: Counter[str] = field(default_factory=Counter)
    _server: http.server.ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, path: str) -> int:
        with self._lock:
            return self.hits[path]

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("stand-in not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StandIn:
        routes: dict[str, tuple[bytes, str]] = {
            "/metrics": (self.metrics, METRICS_CONTENT_TYPE),
            "/version": (b'{"version":"0.32.0"}', "application/json"),
            "/health": (b"", "application/json"),
        }
        if self.gpu_document is not None:
            routes["/sim/gpu"] = (self.gpu_document, "application/json")
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = KEEP_ALIVE_S  # an idle keep-alive connection is closed, as uvicorn does

            def do_GET(self) -> None:
                with stand_in._lock:  # several handler threads at once: one per keep-alive connection
                    stand_in.hits[self.path] += 1
                    scrapes = stand_in.hits[self.path]
                route = routes.get(self.path)
                if route is not None and self.path == "/metrics":
                    route = (advanced(route[0], scrapes), route[1])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body, content_type = route
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        server = _QuietServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
