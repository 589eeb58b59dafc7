"""CPU seconds per tick and peak RSS of the real daemon process polling a loopback vLLM stand-in.

Does I/O: starts `vllm-sidecar run` as a subprocess and a loopback HTTP server that serves a fixed
exposition. Reads /proc for the daemon's CPU time and peak RSS (VmHWM), and a bare `python -c pass`
with the same imports as the reference for memory.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True, slots=True)
class DaemonCost:
    interval_s: float
    ticks: int
    cpu_ms_per_tick: float
    cpu_share_of_one_core: float
    peak_rss_mb: float
    baseline_rss_mb: float  # a Python interpreter that only imports the same libraries


def _serve(body: bytes) -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            payload = {"/metrics": body, "/version": b'{"version":"0.32.0"}', "/health": b""}.get(self.path)
            if payload is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _baseline_rss_mb() -> float:
    code = (
        "import httpx, prometheus_client, structlog, apscheduler, pydantic_settings, pynvml, yaml, pathlib;"
        "print([l for l in pathlib.Path('/proc/self/status').read_text().splitlines() if l.startswith('VmHWM')][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.split()[1]) / 1024


def measure_daemon(body: bytes, *, interval_s: float, duration_s: float) -> DaemonCost:
    server, hits = _serve(body)
    port = server.server_address[1]
    listen_port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "sidecar", "run",
            "--vllm-url", f"http://127.0.0.1:{port}",
            "--listen", f"127.0.0.1:{listen_port}",
            "--interval", str(interval_s),
            "--log-level", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while hits.count("/metrics") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # start-up and the first ticks (imports, window fill) are not steady state
        cpu_before, ticks_before, started = _cpu_seconds(process.pid), hits.count("/metrics"), time.monotonic()
        time.sleep(duration_s)
        httpx.get(f"http://127.0.0.1:{listen_port}/metrics", timeout=5)  # one scrape, as Prometheus would
        cpu, ticks, elapsed = (
            _cpu_seconds(process.pid) - cpu_before,
            hits.count("/metrics") - ticks_before,
            time.monotonic() - started,
        )
        return DaemonCost(
            interval_s=interval_s,
            ticks=ticks,
            cpu_ms_per_tick=cpu * 1000 / max(ticks, 1),
            cpu_share_of_one_core=cpu / elapsed,
            peak_rss_mb=_peak_rss_mb(process.pid),
            baseline_rss_mb=_baseline_rss_mb(),
        )
    finally:
        process.terminate()
        process.wait(timeout=10)
        server.shutdown()


def _free_port() -> int:
    """A free loopback port (bound, then released for the daemon to take)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
