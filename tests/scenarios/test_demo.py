"""`vllm-sidecar demo` in a real terminal (tmux): it draws changing numbers and Ctrl-C stops everything."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

HEADER = re.compile(r"vLLM \(simulated\) (http://127\.0\.0\.1:\d+).*sidecar (http://127\.0\.0\.1:\d+)")
LOAD = re.compile(r"load: (\d+) sent, (\d+) ok")


@pytest.fixture
def tmux() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed: .ci/run must install it")
        pytest.skip("tmux not installed")
    session = f"demo-{uuid.uuid4().hex[:8]}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)


def _screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], check=True, capture_output=True, text=True
    ).stdout


def _wait_for(session: str, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = pattern.search(_screen(session))
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{pattern.pattern!r} never appeared on screen:\n{_screen(session)}")


def test_demo_shows_changing_numbers_and_stops_on_ctrl_c(tmux: str) -> None:
    # The pane's shell may export COLUMNS from the pane's first size; rich prefers it to the live pty size.
    command = f"env -u COLUMNS -u LINES {sys.executable} -m sidecar demo --duration 120; echo demo-exit=$?; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", tmux, "-x", "170", "-y", "50", command], check=True)
    header = _wait_for(tmux, HEADER, 30)
    sim_url, sidecar_url = header.group(1), header.group(2)
    first = _wait_for(tmux, re.compile(r"sim-llama #0 .*\n(?:.*\n)*.*" + LOAD.pattern), 30)
    screen_before = _screen(tmux)
    time.sleep(6)
    screen_after = _screen(tmux)
    assert screen_after != screen_before
    sent_before = int(LOAD.search(screen_before).group(1))  # type: ignore[union-attr]
    sent_after = int(LOAD.search(screen_after).group(1))  # type: ignore[union-attr]
    assert sent_after > sent_before, "the load counter did not move"
    assert re.search(r"\d+\.\d%", screen_after), "no KV or memory percentage on screen"
    assert "GiB" in screen_after
    assert first is not None
    subprocess.run(["tmux", "send-keys", "-t", tmux, "C-c"], check=True)
    _wait_for(tmux, re.compile(r"demo stopped: \d+ requests sent"), 20)
    _wait_for(tmux, re.compile(r"demo-exit=0"), 10)
    for url in (sim_url, sidecar_url):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=1)
