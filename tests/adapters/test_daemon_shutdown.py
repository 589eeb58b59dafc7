"""SIGTERM to a real `vllm-sidecar run` with clients that left their requests half-sent: a clean stop, no traceback."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import LoopbackServer, respond

HALF_REQUESTS = [
    b"",  # connected, sent nothing
    b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n",  # a head without its end
    b"POST /admin/pause HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-part-of-the-body",
]


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    server.routes.update({"/metrics": respond(body=b"vllm:num_requests_running 0\n"), "/health": respond()})
    yield server
    server.close()


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_sigterm_with_half_open_connections_stops_without_a_traceback(
    vllm: LoopbackServer, tmp_path: Path, log_format: str
) -> None:
    process = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--log-format", log_format],
        tmp_path / "sidecar.log",
    )
    clients: list[socket.socket] = []
    try:
        process.wait_ready()
        for data in HALF_REQUESTS:
            client = socket.create_connection(("127.0.0.1", process.port), timeout=5)
            client.sendall(data)
            clients.append(client)
        time.sleep(0.3)  # accepted and reading: the daemon's read timeout (5 s) is far off
        code, took_s = process.stop(signal.SIGTERM)
    finally:
        for client in clients:
            client.close()
        process.kill()
    output = process.log_path.read_text()
    assert code == 0, output
    assert took_s < 5.0
    assert "Traceback" not in output, output
    assert "Exception in callback" not in output, output  # asyncio's own report of a handler task that failed
    last = output.rstrip("\n").splitlines()[-1]
    if log_format == "json":
        assert json.loads(last)["event"] == "stopped"
        assert not [line for line in output.splitlines() if '"exception"' in line]
    else:
        assert "stopped" in last.split(), last
