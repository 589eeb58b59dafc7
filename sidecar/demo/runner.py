"""Runs the demo: the simulator and the daemon as real processes on free loopback ports, load, a live view.

Does I/O: starts and stops subprocesses, reads their logs, polls HTTP, draws on the terminal. When the
simulated vLLM dies, the demo restarts it after a few seconds, standing in for systemd's
Restart=on-failure or a kubelet, and says so; Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
from rich.console import Console
from rich.live import Live

from sidecar.demo.load import LoadCounters, LoadShape, drive
from sidecar.demo.view import Header, render

_ERROR = re.compile(r"\b\w*(?:Error|Exception): .*")
_SIDECAR_EVENTS = {
    "source_failed": "sidecar: cannot read {source}: {error}",
    "source_ok": "sidecar: reading {source}",
    "problem_found": "sidecar: {problem}",
    "problem_resolved": "sidecar: resolved: {problem}",
    "vllm_health_failing": "sidecar: vLLM /health failing",
    "vllm_health_ok": "sidecar: vLLM /health ok",
    "action": "sidecar decides: {action}: {reason}",
    "policy_state": "sidecar policy: {previous} -> {state}",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    scenario: str = "leak"
    vllm_version: str = "0.32"
    interval_s: float = 1.0
    duration_s: float = 0.0  # 0: until Ctrl-C
    restart_delay_s: float = 5.0
    shape: LoadShape = field(default_factory=LoadShape)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Process:
    """A child process writing to a log file, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log: TextIO = log_path.open("a")
        # argv is built here from this interpreter and fixed words: nothing from outside reaches a shell.
        self.process = subprocess.Popen(  # noqa: S603
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def exit_code(self) -> int | None:
        return self.process.poll()

    def cause(self) -> str:
        """The root cause a person would look for: the first `...Error: ...` line, else the last line."""
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        for line in lines:
            found = _ERROR.search(line)
            if found is not None:
                return found.group(0)[:200]
        return lines[-1][:200] if lines else "no output"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Demo:
    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.workdir = Path(tempfile.mkdtemp(prefix="vllm-sidecar-demo-"))
        self.sim_port = free_port()
        self.sidecar_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.sidecar_url = f"http://127.0.0.1:{self.sidecar_port}"
        self.events: list[str] = []
        self.counters = LoadCounters()
        self._started = time.monotonic()
        self._sim: _Process | None = None
        self._sidecar: _Process | None = None
        self._sidecar_log_offset = 0
        self._sim_died_at: float | None = None
        self._sim_starts = 0
        self._stop = asyncio.Event()

    def _event(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self._started:5.0f} s  {text}")

    def _start_sim(self) -> None:
        argv = [sys.executable, "-m", "sidecar", "sim", "--listen", f"127.0.0.1:{self.sim_port}"]
        argv += ["--scenario", self.options.scenario, "--vllm-version", self.options.vllm_version]
        self._sim_starts += 1
        self._sim = _Process(argv, self.workdir / f"sim-{self._sim_starts}.log")
        self._sim_died_at = None

    def _start_sidecar(self) -> None:
        argv = [sys.executable, "-m", "sidecar", "run", "--vllm-url", self.sim_url, "--gpu-source", "sim"]
        argv += ["--listen", f"127.0.0.1:{self.sidecar_port}", "--interval", str(self.options.interval_s)]
        argv += ["--log-format", "json", "--state-dir", str(self.workdir / "state")]
        self._sidecar = _Process(argv, self.workdir / "sidecar.log")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop.set)
        self._start_sim()
        self._event(f"started the simulated vLLM ({self.options.scenario} scenario) on {self.sim_url}")
        if not await self._wait_healthy(30.0):
            cause = self._sim.cause() if self._sim is not None else "not started"
            self.console.print(f"the simulator did not start: {cause}; logs in {self.workdir}")
            self._cleanup()
            return 1
        self._start_sidecar()
        self._event(f"started the sidecar on {self.sidecar_url}")
        load = asyncio.create_task(
            drive(
                vllm_url=self.sim_url,
                readiness_url=self.sidecar_url + "/readyz",
                model="sim-llama",
                shape=self.options.shape,
                counters=self.counters,
                stop=self._stop,
            )
        )
        try:
            await self._show()
        finally:
            self._stop.set()
            await load
            self._cleanup()
        self.console.print(
            f"demo stopped: {self.counters.sent} requests sent, {self.counters.succeeded} ok, "
            f"{self.counters.failed} failed; logs in {self.workdir}"
        )
        return 0

    async def _show(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            with Live(console=self.console, refresh_per_second=4, transient=False) as live:
                while not self._stop.is_set():
                    self._supervise_sim()
                    self._read_sidecar_events()
                    status = await _status(client, self.sidecar_url)
                    live.update(render(self._header(), status, self._load_line_and_events()))
                    if self.options.duration_s and time.monotonic() - self._started >= self.options.duration_s:
                        self._stop.set()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._stop.wait()

    def _header(self) -> Header:
        code = self._sim.exit_code() if self._sim is not None else None
        state = "running" if code is None else f"dead (exit {code})"
        return Header(
            scenario=self.options.scenario,
            sim_url=self.sim_url,
            sidecar_url=self.sidecar_url,
            elapsed_s=time.monotonic() - self._started,
            vllm_state=state,
        )

    def _load_line_and_events(self) -> list[str]:
        c = self.counters
        load = f"load: {c.sent} sent, {c.succeeded} ok, {c.failed} failed, {c.held_by_readiness} held by /readyz"
        return [*self.events, load]

    def _supervise_sim(self) -> None:
        if self._sim is None:
            return
        code = self._sim.exit_code()
        if code is None:
            return
        now = time.monotonic()
        if self._sim_died_at is None:
            self._sim_died_at = now
            self._event(f"vLLM exited with code {code}: {self._sim.cause()}")
        elif now - self._sim_died_at >= self.options.restart_delay_s:
            self._event("restarting vLLM (the demo stands in for systemd Restart=on-failure)")
            self._start_sim()

    def _read_sidecar_events(self) -> None:
        if self._sidecar is None or not self._sidecar.log_path.exists():
            return
        with self._sidecar.log_path.open() as log:
            log.seek(self._sidecar_log_offset)
            lines = log.readlines()
            self._sidecar_log_offset = log.tell()
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                template = _SIDECAR_EVENTS.get(str(record.get("event")))
                if template is not None:
                    self._event(template.format_map(_Missing(record)))

    async def _wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self._sim is not None and self._sim.exit_code() is not None:
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.sim_url + "/health")).status_code == httpx.codes.OK:
                        return True
                await asyncio.sleep(0.2)
        return False

    def _cleanup(self) -> None:
        for process in (self._sidecar, self._sim):
            if process is not None:
                process.stop()


class _Missing(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return "?"


async def _status(client: httpx.AsyncClient, sidecar_url: str) -> dict[str, object] | None:
    try:
        document = (await client.get(sidecar_url + "/status")).json()
    except (httpx.HTTPError, ValueError):
        return None
    return document if isinstance(document, dict) and "engines" in document else None


def run_demo(options: DemoOptions) -> int:
    return asyncio.run(Demo(options, Console()).run())
