"""Runs the demo: the simulator and the daemon as real processes on free loopback ports, beside them the same
simulated vLLM without a sidecar (`twin`), load on both, and what happens, live or line by line.

Does I/O: starts and stops subprocesses, serves the demo's control endpoint, reads the daemon's log, polls
HTTP, writes to the terminal. The daemon runs with a few settings shortened (`story.SHORTENED`) and restarts
vLLM through its exec adapter with the demo's restart command, which asks this process to restart the
simulator cleanly (`supervisor`, `control`). On a terminal the screen is redrawn in place, fitted to its size
(`screen`); anywhere else (a pipe, a file) each event is one line as it happens. Once the story is over (vLLM
back from the sidecar's restart, the vLLM without it crashed: `story.COMPARED`) the demo stops by itself a few
seconds later (unless --keep-running); Ctrl-C (or SIGTERM, SIGHUP) stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console, RenderableType
from rich.live import Live

from sidecar.demo import story
from sidecar.demo.control import ControlServer, write_token
from sidecar.demo.events import EventLog
from sidecar.demo.load import LoadCounters, LoadShape, drive
from sidecar.demo.outcome import Side, side_lines
from sidecar.demo.screen import Frame, screen
from sidecar.demo.sidecar_log import SidecarLog
from sidecar.demo.supervisor import ChildProcess, SimSupervisor
from sidecar.demo.twin import Twin, side, sim_argv, wait_healthy
from sidecar.demo.view import Header
from sidecar.model.text import plural

_RESTARTING_STATES = ("draining", "restarting")


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    scenario: str = "leak"
    vllm_version: str = "0.32"
    interval_s: float = 1.0
    duration_s: float = 0.0  # 0: until Ctrl-C (or the end of the story)
    restart_delay_s: float = 5.0
    keep_running: bool = False  # False: stop once the story is over (story.COMPARED)
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
        self.log = EventLog()
        self.counters = LoadCounters()
        self._started = time.monotonic()
        self._started_wall = time.time()  # the sidecar stamps its log in wall time
        argv = sim_argv(sys.executable, self.sim_port, options.scenario, options.vllm_version)
        self.sim = SimSupervisor(argv, self.workdir, restart_delay_s=options.restart_delay_s, event=self._event)
        self.comparison = story.COMPARED.get(options.scenario)
        self.twin: Twin | None = None
        if self.comparison is not None:
            port = free_port()
            argv = sim_argv(sys.executable, port, options.scenario, options.vllm_version)
            self.twin = Twin(
                argv,
                f"http://127.0.0.1:{port}",
                self.workdir,
                restart_delay_s=options.restart_delay_s,
                event=self._event,
            )
        self._token_path = self.workdir / "control-token"
        self._control = ControlServer(write_token(self._token_path), self._restart_asked)
        self._sidecar: ChildProcess | None = None
        self._sidecar_log: SidecarLog | None = None
        self._sidecar_gone = False
        self._status: dict[str, object] | None = None
        self._back_at: float | None = None
        self._at_stop: tuple[Side, Side | None] | None = None
        self._stop = asyncio.Event()

    @property
    def events(self) -> list[str]:
        return self.log.lines

    @property
    def plain(self) -> bool:
        """Not a terminal: one line per event, nothing redrawn."""
        return not self.console.is_terminal

    def _event(self, text: str) -> None:
        self._read_sidecar_events()  # what the sidecar logged before this happened is told before it
        self._add(time.monotonic() - self._started, text)

    def _add(self, at_s: float, text: str) -> None:
        event = self.log.add(at_s, text)
        with (self.workdir / "demo.log").open("a") as log:  # the whole story, where the screen keeps the last lines
            log.write(event.line + "\n")
        if self.plain:
            self.console.print(event.line, markup=False, highlight=False, soft_wrap=True)

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
        self._sidecar_log = SidecarLog(self._sidecar.log_path, self._started_wall)

    async def _start(self) -> None:
        await self._control.start()
        self.sim.start()
        self._event(f"started the simulated vLLM ({self.options.scenario} scenario) on {self.sim_url}")
        waits = [wait_healthy(self.sim_url, self.sim, 30.0)]
        if self.twin is not None:
            self.twin.sim.start()
            self._event(f"started the same vLLM without a sidecar on {self.twin.url}: same scenario and load")
            waits.append(wait_healthy(self.twin.url, self.twin.sim, 30.0))
        healthy = await asyncio.gather(*waits)
        if not healthy[0]:
            self._event(f"the simulated vLLM is not healthy: {self.sim.cause()}")
        self._start_sidecar()
        self._event(f"started the sidecar on {self.sidecar_url}")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self._stop.set)
        if self.plain:  # once, where the screen keeps them in view
            told = story.STORIES.get(self.options.scenario)
            preamble = [f"vllm-sidecar demo: scenario {self.options.scenario}" + (f": {told}" if told else "")]
            for line in [*preamble, f"{story.shortened_line()}; {story.ADAPTER_NOTE}"]:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        live = None if self.plain else Live(console=self.console, auto_refresh=False, vertical_overflow="crop")
        with live or contextlib.nullcontext():
            shown = asyncio.create_task(self._show(live))  # from the first moment: the start takes seconds
            load: asyncio.Task[None] | None = None
            try:
                await self._start()
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
                if self.twin is not None:
                    self.twin.start_load(self.options.shape, self._stop)
                await shown
            finally:
                self._stop.set()
                self._at_stop = self._side_values(time.monotonic())  # before the stop cuts what was in flight
                await asyncio.gather(shown, return_exceptions=True)  # its error, if any, is raised above
                if load is not None:
                    await load
                if self.twin is not None:
                    await self.twin.stop_load()
                await self._cleanup()
            self._finish(live)
        return 0

    def _finish(self, live: Live | None) -> None:
        now = time.monotonic()
        if live is not None:  # the last frame: the outcomes, and the exit line where the countdown was
            live.update(self._screen(now, footer=self.exit_line()), refresh=True)
            return
        for line in [*self._sides(now), self.exit_line()]:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def exit_line(self) -> str:
        c = self.counters
        interrupted = f", {c.interrupted} interrupted by the stop" if c.interrupted else ""
        return (
            f"demo stopped: {plural(c.sent, 'request')} sent, {c.succeeded} ok, {c.failed} failed{interrupted}; "
            f"vLLM crashed {plural(self.sim.crashes, 'time')}, restarted by the sidecar "
            f"{plural(self.sim.restarts_by_sidecar, 'time')}; "
            f"logs in {self.workdir}"
        )

    async def _show(self, live: Live | None) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while not self._stop.is_set():
                now = time.monotonic()
                self.sim.supervise(now)
                if self.twin is not None:
                    self.twin.sim.supervise(now)
                self._watch_sidecar()
                self._read_sidecar_events()
                restarted = self.sim.restarts_by_sidecar  # before the request: its answer is at least this new
                self._status = await _status(client, self.sidecar_url)
                self._follow_policy(self._status, now, restarted)
                if live is not None:
                    live.update(self._screen(now), refresh=True)
                if self._should_stop(now):
                    self._stop.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._stop.wait()

    def _screen(self, now: float, footer: str | None = None) -> RenderableType:
        width, height = self.console.size
        frame = Frame(
            header=self._header(now),
            status=self._status,
            sides=self._sides(now),
            events=self.events,
            footer=footer or self._ending(now),
        )
        # One row fewer than the terminal: the cursor rests below the frame, and a full-height frame would scroll.
        return screen(frame, self.console, width, max(1, height - 1))

    def _side_values(self, now: float) -> tuple[Side, Side | None]:
        """The sidecar's vLLM and the one without it; once stopped, as they were at the stop, finally counted."""
        mine = side(self.sim, self.counters, self._started, now)
        without = None if self.twin is None else self.twin.side(self._started, now)
        if self._at_stop is None:
            return mine, without
        was_mine, was_without = self._at_stop
        counted = None if was_without is None or without is None else was_without.counted_as(without)
        return was_mine.counted_as(mine), counted

    def _sides(self, now: float) -> list[str]:
        mine, without = self._side_values(now)
        return side_lines(without, mine)

    def _watch_sidecar(self) -> None:
        if self._sidecar is not None and not self._sidecar_gone:
            code = self._sidecar.exit_code()
            if code is not None:
                self._sidecar_gone = True
                self._event(f"the sidecar exited with code {code}: {self._sidecar.cause()}")

    def _follow_policy(self, status: dict[str, object] | None, now: float, restarted: int) -> None:
        """Notice the sidecar's restart end: a policy answer given after the demo restarted the simulator for it,
        neither draining nor restarting."""
        policy = status.get("policy") if status is not None else None
        if not isinstance(policy, dict):
            return
        state = str(policy.get("state"))
        if restarted and self._back_at is None and state not in _RESTARTING_STATES:
            self._back_at = now
            self._event(f"the sidecar's restart is over (policy {state}): vLLM serves again")

    def _end_at(self, now: float) -> float | None:
        crash = None if self.twin is None or self.twin.sim.first_crash is None else self.twin.sim.first_crash[0]
        return story.end_at(self.comparison, back_s=self._back_at, twin_crash_s=crash, now_s=now)

    def _should_stop(self, now: float) -> bool:
        if self.options.duration_s and now - self._started >= self.options.duration_s:
            return True
        end = None if self.options.keep_running else self._end_at(now)
        return end is not None and now >= end

    def _ending(self, now: float) -> str:
        end = None if self.options.keep_running else self._end_at(now)
        if end is not None:
            return f"the story is over: the demo stops in {max(0.0, end - now):.0f} s (--keep-running: stay)"
        if self.options.duration_s:
            return f"stops at {self.options.duration_s:.0f} s; Ctrl-C stops it now"
        return "Ctrl-C stops the demo" + ("" if self.options.keep_running else " (or once the story is over)")

    def _header(self, now: float) -> Header:
        return Header(
            scenario=self.options.scenario,
            sim_url=self.sim_url,
            sidecar_url=self.sidecar_url,
            elapsed_s=now - self._started,
            story=story.STORIES.get(self.options.scenario, ""),
            settings=f"{story.shortened_line()}; {story.ADAPTER_NOTE}",
            ending=self._ending(now),
        )

    def _read_sidecar_events(self) -> None:
        if self._sidecar_log is None:
            return
        now = time.monotonic() - self._started
        for at_s, text in self._sidecar_log.new_lines():
            self._add(now if at_s is None else min(at_s, now), text)

    async def _cleanup(self) -> None:
        if self._sidecar is not None:
            await self._sidecar.stop_async()  # first, so that it asks for no more restarts
        await self._control.stop()
        self.sim.stop()
        if self.twin is not None:
            self.twin.sim.stop()


async def _status(client: httpx.AsyncClient, sidecar_url: str) -> dict[str, object] | None:
    try:
        document = (await client.get(sidecar_url + "/status")).json()
    except (httpx.HTTPError, ValueError):
        return None
    return document if isinstance(document, dict) and "engines" in document else None


def run_demo(options: DemoOptions) -> int:
    return asyncio.run(Demo(options, Console()).run())
