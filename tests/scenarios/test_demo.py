"""`vllm-sidecar demo` in a real terminal (tmux): the default demo draws changing numbers and the policy with its
reason, and its story ends with the sidecar's planned, drained restart before the leak crashed vLLM; Ctrl-C then
stops everything (the demo would stop by itself 10 s later: `test_demo_parts` covers that decision, and this
test saves the wait); a bad scenario name is refused."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

HEADER = re.compile(r"vLLM \(simulated\) (http://127\.0\.0\.1:\d+).*sidecar (http://127\.0\.0\.1:\d+)")
LOAD = re.compile(r"load: (\d+) sent, (\d+) ok")
EXIT_LINE = re.compile(
    r"^demo stopped: (\d+) requests sent, (\d+) ok, (\d+) failed; "
    r"vLLM crashed (\d+) times, restarted by the sidecar (\d+) times; logs in (\S+)$",
    re.MULTILINE,
)
POLICY_LINES = re.compile(r"state: [A-Z]+ (?:.*\n)+?.*why: \S(?:.*\n)+?.*would restart, but: \S")


@pytest.fixture
def tmux() -> Iterator[str]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed: .ci/run must install it")
        pytest.skip("tmux not installed")
    session = f"demo-{uuid.uuid4().hex[:8]}"
    yield session
    subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)


def _start(session: str, *args: str) -> None:
    # The pane's shell may export COLUMNS from the pane's first size; rich prefers it to the live pty size.
    demo = " ".join([sys.executable, "-m", "sidecar", "demo", *args])
    command = f"env -u COLUMNS -u LINES {demo}; echo demo-exit=$?; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "170", "-y", "50", command], check=True)


def _screen(session: str) -> str:
    # -J joins lines the terminal wrapped, so the exit line reads as the one line it is.
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-J", "-t", session], check=True, capture_output=True, text=True
    ).stdout


def _wait_for(session: str, pattern: re.Pattern[str], timeout_s: float, seen: list[str] | None = None) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        screen = _screen(session)
        if seen is not None:
            seen.append(screen)
        found = pattern.search(screen)
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{pattern.pattern!r} never appeared on screen:\n{_screen(session)}")


def _sidecar_records(logs: Path) -> list[dict[str, object]]:
    records = []
    for line in (logs / "sidecar.log").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _gone(*urls: str) -> None:
    for url in urls:
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=1)


def test_the_default_demo_ends_with_a_planned_drained_restart_before_the_crash(tmux: str) -> None:
    _start(tmux, "--duration", "150")  # only bounds a broken run: the story is over about 55 s in
    header = _wait_for(tmux, HEADER, 30)
    sim_url, sidecar_url = header.group(1), header.group(2)
    _wait_for(tmux, re.compile(r"sim-llama #0 .*\n(?:.*\n)*.*" + LOAD.pattern), 30)
    screen_before = _screen(tmux)
    assert POLICY_LINES.search(screen_before), "the policy's state, reason and held-back restart are on screen"
    assert "--forecast-min-uptime 40 (default 600)" in screen_before, "the shortened settings are on screen"
    assert "sidecar.demo.restart" in screen_before, "and how the sidecar restarts the simulator"
    time.sleep(4)
    screen_after = _screen(tmux)
    assert screen_after != screen_before
    sent_before = int(LOAD.search(screen_before).group(1))  # type: ignore[union-attr]
    sent_after = int(LOAD.search(screen_after).group(1))  # type: ignore[union-attr]
    assert sent_after > sent_before, "the load counter did not move"
    assert re.search(r"\d+\.\d%", screen_after), "no KV or memory percentage on screen"
    assert "GiB" in screen_after

    screens: list[str] = []
    _wait_for(tmux, re.compile(r"the sidecar's restart is over"), 120, screens)
    assert any(re.search(r"would restart, but: vLLM up only \d+ s < 40 s", s) for s in screens), (
        "the restart held back by the shortened uptime guard was on screen, with its reason"
    )
    assert any("state: DRAINING" in s for s in screens)
    assert "the demo stops in" in _screen(tmux)
    subprocess.run(["tmux", "send-keys", "-t", tmux, "C-c"], check=True)
    exit_line = _wait_for(tmux, EXIT_LINE, 30)
    sent, ok, failed, crashed, restarted = (int(exit_line.group(i)) for i in range(1, 6))
    assert (crashed, restarted) == (0, 1), exit_line.group(0)
    assert sent >= ok + failed
    assert ok > 0
    _wait_for(tmux, re.compile(r"demo-exit=0"), 15)
    _gone(sim_url, sidecar_url)

    logs = Path(exit_line.group(6))
    restarts = [r for r in _sidecar_records(logs) if r.get("event") == "action" and r.get("action") == "restart"]
    assert len(restarts) == 1
    assert str(restarts[0]["reason"]).startswith("drained: 0 requests running; restarting vLLM (oom_forecast)")
    for sim_log in logs.glob("sim-*.log"):
        assert "CUDA out of memory" not in sim_log.read_text(), f"vLLM crashed: {sim_log}"
    story = (logs / "demo.log").read_text()
    assert "the simulated GPU when the sidecar asked: GPU 0:" in story
    assert re.search(r"vLLM restarted for the sidecar: stopped pid \d+ \(exit 0\); started pid \d+", story)
    assert "CRASHED" not in story


def test_an_unknown_scenario_is_refused_with_the_names_it_accepts() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "demo", "--scenario", "hangg"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "invalid choice: 'hangg'" in result.stderr
    assert "'hang-idle'" in result.stderr
    assert result.stdout == ""
