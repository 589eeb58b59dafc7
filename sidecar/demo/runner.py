"""Runs the demo: the simulator and the daemon as real processes on free loopback ports, load, a live view.

Does I/O: starts and stops subprocesses, serves the demo's control endpoint, reads the daemon's log, polls
HTTP, draws on the terminal. The daemon runs with a few settings shortened (`story.SHORTENED`) and restarts
vLLM through its exec adapter with the demo's restart command, which asks this process to restart the
simulator cleanly (`supervisor`, `control`). Once vLLM is back from the sidecar's first restart the demo
stops by itself after a few seconds (unless --keep-running); Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.live import Live

from sidecar.demo import story
from sidecar.demo.control import ControlServer, write_token
from sidecar.demo.load import LoadCounters, LoadShape, drive
from sidecar.demo.supervisor import ChildProcess, SimSupervisor
from sidecar.demo.view import Header, render
from sidecar.model.text import plural

LINGER_S = 10.0  # after vLLM is back from the sidecar's restart: long enough to see it serve again
_SIDECAR_EVENTS = {
    "source_failed": "sidecar: cannot read {source}: {error}",
    "source_ok": "sidecar: reading {source}",
    "problem_found": "sidecar: {problem}",
    "problem_resolved": "sidecar: resolved: {problem}",
    "vllm_health_failing": "sidecar: vLLM /health failing",
    "vllm_health_ok": "sidecar: vLLM /health ok",
    "action": "sidecar decides: {action}: {reason}",
    "policy_state": "sidecar policy: {previous} -> {state}: {reason}",
    "restart_outcome": "sidecar: restart adapter ({adapter}) {status} after {duration_s} s: {detail}",
}
_RESTART_DONE = "sidecar: restart adapter ({adapter}) done after {duration_s} s"  # the detail is the demo's own line
_RESTARTING_STATES = ("draining", "restarting")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    scenario: str = "leak"
    vllm_version: str = "0.32"
    interval_s: float = 1.0
    duration_s: float = 0.0  # 0: until Ctrl-C (or the end of the story)
    restart_delay_s: float = 5.0
    keep_running: bool = False  # False: stop LINGER_S after vLLM is back from the sidecar's first restart
    shape: LoadShape = field(default_factory=LoadShape)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
        argv = [sys.executable, "-m", "sidecar", "sim", "--listen", f"127.0.0.1:{self.sim_port}"]
        argv += ["--scenario", options.scenario, "--vllm-version", options.vllm_version]
        self.sim = SimSupervisor(argv, self.workdir, restart_delay_s=options.restart_delay_s, event=self._event)
        self._token_path = self.workdir / "control-token"
        self._control = ControlServer(write_token(self._token_path), self._restart_asked)
        self._sidecar: ChildProcess | None = None
        self._sidecar_log_offset = 0
        self._sidecar_gone = False
        self._blocked_shape: str | None = None  # the held-back restart's line without its numbers, to say it once
        self._back_at: float | None = None
        self._stop = asyncio.Event()

    def _event(self, text: str) -> None:
        line = f"{time.monotonic() - self._started:5.0f} s  {text}"
        self.events.append(line)
        with (self.workdir / "demo.log").open("a") as log:  # the whole story, where the screen keeps the last lines
            log.write(line + "\n")

    async def _restart_asked(self, reason: str) -> str:
        self._event(f"the simulated GPU when the sidecar asked: {await self._margin()}")
        return await self.sim.restart(reason)

    async def _margin(self) -> str:
        """How far vLLM was from running out of GPU memory, from the simulator itself (not the sidecar)."""
        try:
            async with httpx.AsyncClient(timeout=1.0) as client:
                gpus = (await client.get(self.sim_url + "/sim/gpu")).json()["gpus"]
            free = [(gpu["total_bytes"] - gpu["used_bytes"]) / 2**30 for gpu in gpus]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return "unknown (the simulator did not answer)"
        return ", ".join(f"GPU {index}: {gib:.1f} GiB free" for index, gib in enumerate(free))

    def _start_sidecar(self) -> None:
        restart = [sys.executable, "-m", "sidecar.demo.restart", "--url", self._control.url]
        restart += ["--token-file", str(self._token_path)]
        argv = [sys.executable, "-m", "sidecar", "run", "--vllm-url", self.sim_url, "--gpu-source", "sim"]
        argv += ["--listen", f"127.0.0.1:{self.sidecar_port}", "--interval", str(self.options.interval_s)]
        argv += ["--log-format", "json", "--state-dir", str(self.workdir / "state")]
        argv += ["--actuator", "exec", "--exec-command", shlex.join(restart), *story.daemon_flags()]
        self._sidecar = ChildProcess(argv, self.workdir / "sidecar.log")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop.set)
        await self._control.start()
        self.sim.start()
        self._event(f"started the simulated vLLM ({self.options.scenario} scenario) on {self.sim_url}")
        if not await self._wait_healthy(30.0):
            self._event(f"the simulated vLLM is not healthy: {self.sim.cause()}")
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
            await self._cleanup()
        if not self.console.is_terminal:
            print(flush=True)  # rich's last frame ends without a newline when not on a terminal: the line stands alone
        print(self.exit_line(), flush=True)
        return 0

    def exit_line(self) -> str:
        c = self.counters
        return (
            f"demo stopped: {plural(c.sent, 'request')} sent, {c.succeeded} ok, {c.failed} failed; "
            f"vLLM crashed {plural(self.sim.crashes, 'time')}, restarted by the sidecar "
            f"{plural(self.sim.restarts_by_sidecar, 'time')}; "
            f"logs in {self.workdir}"
        )

    async def _show(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            with Live(console=self.console, refresh_per_second=4, transient=False) as live:
                while not self._stop.is_set():
                    now = time.monotonic()
                    self.sim.supervise(now)
                    self._watch_sidecar()
                    self._read_sidecar_events()
                    restarted = self.sim.restarts_by_sidecar  # before the request: its answer is at least this new
                    status = await _status(client, self.sidecar_url)
                    self._follow_policy(status, now, restarted)
                    live.update(render(self._header(now), status, self._load_line_and_events()))
                    if self._should_stop(now):
                        self._stop.set()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._stop.wait()

    def _watch_sidecar(self) -> None:
        if self._sidecar is not None and not self._sidecar_gone:
            code = self._sidecar.exit_code()
            if code is not None:
                self._sidecar_gone = True
                self._event(f"the sidecar exited with code {code}: {self._sidecar.cause()}")

    def _follow_policy(self, status: dict[str, object] | None, now: float, restarted: int) -> None:
        """Say a held-back restart once (its line without numbers changes), and notice the sidecar's restart end
        (a policy answer given after the demo restarted the simulator for it, neither draining nor restarting)."""
        policy = status.get("policy") if status is not None else None
        if not isinstance(policy, dict):
            return
        blocked = policy.get("would_restart_but")
        shape = _NUMBER.sub("#", str(blocked)) if blocked else None
        if shape is not None and shape != self._blocked_shape:
            self._event(f"sidecar {policy.get('reason')}")
        self._blocked_shape = shape
        state = str(policy.get("state"))
        if restarted and self._back_at is None and state not in _RESTARTING_STATES:
            self._back_at = now
            self._event(f"the sidecar's restart is over (policy {state}): vLLM serves again")

    def _should_stop(self, now: float) -> bool:
        if self.options.duration_s and now - self._started >= self.options.duration_s:
            return True
        return not self.options.keep_running and self._back_at is not None and now - self._back_at >= LINGER_S

    def _ending(self, now: float) -> str:
        if self._back_at is not None and not self.options.keep_running:
            left = max(0.0, self._back_at + LINGER_S - now)
            return f"vLLM is back from the sidecar's restart: the demo stops in {left:.0f} s (--keep-running: stay)"
        if self.options.duration_s:
            return f"stops at {self.options.duration_s:.0f} s; Ctrl-C stops it now"
        return "Ctrl-C stops the demo" + ("" if self.options.keep_running else " (or 10 s after the sidecar's restart)")

    def _header(self, now: float) -> Header:
        return Header(
            scenario=self.options.scenario,
            sim_url=self.sim_url,
            sidecar_url=self.sidecar_url,
            elapsed_s=now - self._started,
            vllm_state=self.sim.state(now),
            story=story.STORIES.get(self.options.scenario, ""),
            settings=f"{story.shortened_line()}; {story.ADAPTER_NOTE}",
            crashes=self.sim.crashes,
            restarts_by_sidecar=self.sim.restarts_by_sidecar,
            ending=self._ending(now),
        )

    def _load_line_and_events(self) -> list[str]:
        c = self.counters
        load = (
            f"load: {c.sent} sent, {c.succeeded} ok, {c.failed} failed, {c.in_flight} in flight, "
            f"{c.held_by_readiness} sends held by /readyz"
        )
        return [*self.events, load]

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
                if record.get("event") == "restart_outcome" and record.get("status") == "done":
                    template = _RESTART_DONE
                if template is not None:
                    self._event(template.format_map(_Missing(record)))

    async def _wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                process = self.sim.process
                if process is not None and process.exit_code() is not None:
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.sim_url + "/health")).status_code == httpx.codes.OK:
                        return True
                await asyncio.sleep(0.2)
        return False

    async def _cleanup(self) -> None:
        if self._sidecar is not None:
            await self._sidecar.stop_async()  # first, so that it asks for no more restarts
        await self._control.stop()
        self.sim.stop()


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
