"""End to end under a real systemd: the simulator's `leak` scenario as a unit, load sent the way a router sends it
(only while the sidecar's /readyz says 200), and the daemon's planned restart through the systemd adapter. (The
`burst`, where the sidecar only pauses admission, is a virtual-time story in
tests/scenarios/test_virtual_time_stories.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port

from .test_acting_systemd_e2e import _healthy, _main_pid, _wait
from .units import python_lines, service
from .user_systemd import UserSystemd


def _start_sim_unit(manager: UserSystemd, scenario: str, log: Path) -> tuple[str, str]:
    port = closed_port()
    unit = f"{scenario}vllm-{uuid.uuid4().hex[:8]}.service"
    manager.write_unit(
        unit,
        service(
            "Type=exec",
            *python_lines("-m", "sidecar", "sim", "--listen", f"127.0.0.1:{port}", "--scenario", scenario),
            # Every process of the unit, across restarts, appends here: what vLLM printed is checked below.
            f"StandardOutput=append:{log}",
            f"StandardError=append:{log}",
            description=f"simulated vLLM, {scenario} scenario",
        ),
    )
    manager.call("StartUnit", "ss", unit, "replace")
    url = f"http://127.0.0.1:{port}"
    _wait(lambda: _healthy(url), 30, "the simulator to answer /health")
    return unit, url


def _sidecar(manager: UserSystemd, unit: str, url: str, tmp_path: Path, *extra: str) -> SidecarProcess:
    sidecar = SidecarProcess(
        [
            *("--vllm-url", url, "--gpu-source", "sim", "--interval", "0.5", "--state-dir", str(tmp_path / "state")),
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit, *extra),
        ],
        tmp_path / "sidecar.log",
        env={"DBUS_SESSION_BUS_ADDRESS": manager.bus_address},
    )
    sidecar.wait_ready()
    return sidecar


def _loadtest(url: str, sidecar: SidecarProcess, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "sidecar", "loadtest", "--url", url, "--json", "--quiet"),
            *("--readiness-url", sidecar.url + "/readyz", *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(sidecar: SidecarProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if line.startswith("{")]


def test_leak_gets_a_planned_restart_before_it_kills_vllm(user_systemd: UserSystemd, tmp_path: Path) -> None:
    vllm_log = tmp_path / "vllm.log"
    unit, url = _start_sim_unit(user_systemd, "leak", vllm_log)
    first_pid = _main_pid(user_systemd, unit)
    sidecar = _sidecar(user_systemd, unit, url, tmp_path, "--forecast-min-uptime", "10", "--drain-timeout", "10")
    load = _loadtest(
        url, sidecar, "--concurrency", "32", "--prompt-tokens", "1000", "--output-tokens", "128", "--duration", "90"
    )
    try:
        _wait(lambda: _main_pid(user_systemd, unit) not in (None, first_pid), 100, "a restart of the leaking vLLM")
        _wait(lambda: _healthy(url), 30, "the restarted simulator to answer /health")
        metrics = sidecar.get("/metrics").text
    finally:
        load.kill()
        sidecar.kill()
        user_systemd.call("StopUnit", "ss", unit, "replace")
    assert 'vllm_sidecar_restarts_total{reason="oom_forecast"} 1.0' in metrics
    outcomes = [e for e in _events(sidecar) if e["event"] == "restart_outcome"]
    assert [(e["status"]) for e in outcomes] == ["done"]
    # A planned restart, not a crash: two starts of vLLM in its log, and no out-of-memory death before them.
    printed = vllm_log.read_text()
    assert printed.count("Uvicorn running") == 2
    assert "OutOfMemoryError" not in printed
