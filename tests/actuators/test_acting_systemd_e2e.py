"""End to end: the simulator's `hang` scenario under a real systemd, load from `vllm-sidecar loadtest`, and
the daemon with `--actuator systemd` seeing the stall, pausing admission, draining and restarting the unit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

from sidecar.actuators.systemd import SystemdActuator
from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port

from .units import python_lines, service
from .user_systemd import UserSystemd


def _main_pid(manager: UserSystemd, unit: str) -> int | None:
    actuator = SystemdActuator(unit, bus="user", bus_address=manager.bus_address)
    return asyncio.run(actuator.read_state()).main_pid


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class ReadinessWatch:
    """Records every /readyz status of the sidecar, every 0.2 s (bounded in time)."""

    def __init__(self, url: str, max_seconds: float = 120.0) -> None:
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            with contextlib.suppress(httpx.HTTPError):
                self.statuses.append(httpx.get(url + "/readyz", timeout=1).status_code)
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_a_hung_engine_is_drained_and_restarted_through_systemd(user_systemd: UserSystemd, tmp_path: Path) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    unit = f"hungvllm-{uuid.uuid4().hex[:8]}.service"
    user_systemd.write_unit(
        unit,
        service(
            "Type=exec",
            *python_lines("-m", "sidecar", "sim", "--listen", f"127.0.0.1:{port}", "--scenario", "hang"),
            description="simulated vLLM that hangs 10 s after its first request",
        ),
    )
    user_systemd.call("StartUnit", "ss", unit, "replace")
    _wait(lambda: _healthy(url), 30, "the simulator to answer /health")
    first_pid = _main_pid(user_systemd, unit)
    state_dir = tmp_path / "state"
    sidecar = SidecarProcess(
        [
            *("--vllm-url", url, "--gpu-source", "sim", "--interval", "0.5", "--state-dir", str(state_dir)),
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit),
            *("--hung-after", "4", "--drain-timeout", "2", "--startup-timeout", "60"),
            # The engine probe proves the simulator's hang: it gets no answer within 2 s.
            *("--probe-timeout", "2"),
        ],
        tmp_path / "sidecar.log",
        env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
    )
    load = None
    try:
        sidecar.wait_ready()
        readiness = ReadinessWatch(sidecar.url)
        load = subprocess.Popen(
            [
                *(sys.executable, "-m", "sidecar", "loadtest", "--url", url, "--json", "--quiet"),
                *("--concurrency", "8", "--duration", "14", "--timeout", "5"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(lambda: _main_pid(user_systemd, unit) not in (None, first_pid), 60, "systemd to run a new vLLM")
        _wait(lambda: _healthy(url), 30, "the restarted simulator to answer /health")
        _wait(
            lambda: sidecar.get("/status").json()["policy"]["state"] in ("cooldown", "normal"),
            30,
            "the policy to see vLLM healthy again",
        )
        _wait(lambda: readiness.statuses[-1:] == [200], 10, "/readyz to answer 200 again")
        readiness.stop()
        metrics = sidecar.get("/metrics").text
        status = sidecar.get("/status").json()["policy"]
    finally:
        if load is not None:
            load.kill()
        sidecar.kill()
    assert 'vllm_sidecar_restarts_total{reason="engine_hung"} 1.0' in metrics
    assert 'vllm_sidecar_actions_total{action="drain"} 1.0' in metrics
    assert status["restarts"] == {"engine_hung": 1}
    # Admitting, paused for the drain and restart, admitting again: in that order.
    assert readiness.statuses[0] == 200
    paused_at = readiness.statuses.index(503)
    assert 200 in readiness.statuses[paused_at:], f"admission did not resume after the restart: {status}"
    ledger = json.loads((state_dir / "restart-ledger.json").read_text())
    assert [record["reason"] for record in ledger["restarts"]] == ["engine_hung"]
    events = [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if line.startswith("{")]
    outcomes = [event for event in events if event["event"] == "restart_outcome"]
    assert [(event["adapter"], event["status"]) for event in outcomes] == [("systemd", "done")]
    notified = [event["kind"] for event in events if event["event"] == "notification"]
    assert notified == ["pause", "restart_begin", "resume", "restart_end"]
