"""Real processes for scenario tests: the simulator, the sidecar daemon, the load tester, and a watcher."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port


class SimProcess:
    def __init__(self, scenario: str, log_path: Path, *overrides: str) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar",
                "sim",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--scenario",
                scenario,
                *overrides,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.exited_at: float | None = None

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sim exited {self.process.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("sim not healthy in time")

    def wait_exit(self, timeout_s: float) -> int:
        code = self.process.wait(timeout=timeout_s)
        self.exited_at = time.monotonic()
        return code

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


def start_loadtest(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "loadtest", "--url", url, "--json", "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def loadtest_report(process: subprocess.Popen[str], timeout_s: float = 120) -> tuple[int, dict[str, Any]]:
    stdout, stderr = process.communicate(timeout=timeout_s)
    try:
        report: dict[str, Any] = json.loads(stdout)
    except ValueError as error:
        raise AssertionError(f"loadtest printed no JSON: {stdout!r} {stderr!r}") from error
    return process.returncode, report


class StatusWatch:
    """The sidecar's /status every 0.25 s, stamped with time.monotonic(); bounded in time."""

    def __init__(self, sidecar_url: str, max_seconds: float = 180.0) -> None:
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._url = sidecar_url
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                try:
                    document = client.get(self._url + "/status").json()
                    if "engines" in document:
                        self.samples.append((time.monotonic(), document))
                except (httpx.HTTPError, ValueError):
                    pass
                self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def gpus_before(self, moment: float) -> list[dict[str, Any]]:
        return [gpu for t, document in self.samples if t < moment for gpu in document["gpus"]]

    def engines(self) -> list[dict[str, Any]]:
        return [engine for _, document in self.samples for engine in document["engines"]]


def start_sidecar(sim_url: str, log_path: Path, *args: str) -> SidecarProcess:
    sidecar = SidecarProcess(["--vllm-url", sim_url, "--gpu-source", "sim", "--interval", "0.5", *args], log_path)
    sidecar.wait_ready()
    return sidecar
