"""A real vLLM on CPU whose EngineCore is stopped with SIGSTOP while idle: the daemon finds the wedge with its
engine probe, and before it restarts vLLM (exec adapter) the incident folder holds the stopped engine core's
Python stack, read by py-spy, with the API server's, vLLM's log and its last /metrics.

Expected before the first run: the incident's cause is engine_hung, taken before the restart; its stacks are
of the EngineCore (state T, frames in vllm/v1/engine/core.py) and of the API server; the log and the metrics
are captured; the whole capture stays under --incident-timeout. Takes about 1-2 minutes (one vLLM start).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from sidecar.doctor_cli.incident_reading import read_incident
from sidecar.model.incident import MANIFEST_FILE
from sidecar.sources.stack_dump import find_py_spy
from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import required_in_ci

from .conftest import _installed_paths
from .vllm.server import SERVED_MODEL_NAME, start_vllm

pytestmark = pytest.mark.e2e

INCIDENT_TIMEOUT_S = 10.0
ENGINE_MODULE = "vllm/v1/engine/core.py"


def _wait(predicate: object, timeout_s: float, what: str, sidecar: SidecarProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            events = [f"{e.get('event')}: {e.get('reason') or e.get('detail') or ''}" for e in sidecar.events()]
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; sidecar: {events[-20:]}")
        time.sleep(0.2)


def test_the_incident_holds_the_stopped_engine_cores_stack(tmp_path: Path) -> None:
    if find_py_spy() is None:
        if required_in_ci():
            pytest.fail("py-spy is required in CI (the dev extra installs it)", pytrace=False)
        pytest.skip("py-spy not installed")
    python, model = _installed_paths()
    server = start_vllm(python, model, tmp_path / "vllm" / "server.log")
    marker = tmp_path / "restarted"
    restart = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('x')\""
    sidecar = SidecarProcess(
        [
            *("--vllm-url", server.base_url, "--interval", "1", "--gpu-source", "none"),
            *("--state-dir", str(tmp_path / "state"), "--actuator", "exec", "--exec-command", restart),
            *("--stall-pause-after", "3", "--probe-after", "6", "--probe-timeout", "6", "--hung-after", "8"),
            *("--vllm-log", str(server.log_path), "--incident-timeout", str(INCIDENT_TIMEOUT_S)),
        ],
        tmp_path / "sidecar.log",
    )
    try:
        sidecar.wait_ready(timeout_s=60)
        answer = httpx.post(
            server.base_url + "/v1/completions",
            json={
                "model": SERVED_MODEL_NAME,
                "prompt": "The quick brown fox jumps over the lazy dog.",
                "max_tokens": 8,
            },
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        _wait(lambda: sidecar.get("/status").json()["policy"]["state"] == "normal", 60, "state normal", sidecar)
        (engine,) = server.engine_core_pids()
        os.kill(engine, signal.SIGSTOP)
        _wait(marker.is_file, 180, "the hung engine's restart", sidecar)
        status = sidecar.get("/status").json()
    finally:
        sidecar.kill()
        server.stop()
    last = status["policy"]["last_incident"]
    assert last is not None, status["policy"]
    folder = Path(last["path"])
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    print(json.dumps(manifest, indent=2))  # pytest -s: the manifest of a real incident
    assert manifest["cause"] == "engine_hung"
    assert manifest["trigger"] == "before_restart"
    assert manifest["capture_seconds"] < INCIDENT_TIMEOUT_S
    stacks = {item["role"]: item for item in manifest["captured"] if item["kind"] == "stacks"}
    assert set(stacks) >= {"engine_core", "api_server"}, manifest
    assert stacks["engine_core"]["pid"] == engine
    engine_stack = (folder / stacks["engine_core"]["file"]).read_text()
    print(engine_stack)
    assert "state T" in engine_stack.splitlines()[0]
    assert ENGINE_MODULE in engine_stack
    assert {item["kind"] for item in manifest["captured"]} >= {"stacks", "log", "metrics", "status_history"}
    # The API server's command line, for `doctor --incident` (the flags a log's tail may not state).
    assert "vllm.entrypoints.openai.api_server --model " in manifest["vllm_command"], manifest
    assert any(f"engine_core {engine} " in line for line in read_incident(folder).lines)
