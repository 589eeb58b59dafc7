"""The daemon under systemd's notify protocol: READY=1 once it serves, WATCHDOG=1 at half WATCHDOG_USEC,
STOPPING=1 on SIGTERM. A test-bound datagram socket plays systemd."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import LoopbackServer, respond


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    receiver.settimeout(0.2)
    yield receiver, path
    receiver.close()


def _messages_until(receiver: socket.socket, enough: Callable[[list[str]], bool], limit_s: float = 30.0) -> list[str]:
    """The messages received until `enough` holds of them (or `limit_s` passes: a start slowed by a busy machine
    is waited for, not failed)."""
    found: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not enough(found):
        try:
            found.append(receiver.recv(4096).decode())
        except TimeoutError:
            continue
    return found


def _pings(messages: list[str]) -> int:
    return sum(message == "WATCHDOG=1" for message in messages)


def test_ready_watchdog_and_stopping(notify_socket: tuple[socket.socket, str], tmp_path: Path) -> None:
    receiver, path = notify_socket
    vllm = LoopbackServer()
    vllm.routes.update({"/metrics": respond(body=b"vllm:num_requests_running 0\n"), "/health": respond()})
    sidecar = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--state-dir", str(tmp_path / "s")],
        tmp_path / "sidecar.log",
        env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"},
    )
    try:
        first = _messages_until(receiver, lambda found: _pings(found) >= 3)
        assert first, "no message from the sidecar"
        assert first[0].startswith("READY=1")
        assert f"STATUS=watching {vllm.url}" in first[0]
        assert _pings(first) >= 3, first  # every 0.5 s (half of WATCHDOG_USEC) while the loop is alive
        sidecar.stop()
        last = _messages_until(receiver, lambda found: any(message.startswith("STOPPING=1") for message in found))
        assert any(message.startswith("STOPPING=1") for message in last), last
    finally:
        sidecar.kill()
        vllm.close()
