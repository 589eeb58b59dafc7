"""Efficacy: the simulator's failure scenarios under a fixed load, with the sidecar off and on, side by side.

Does I/O: runs the simulator under a supervisor thread that stands in for systemd (a crash, the simulator's
exit 1, started again after RestartSec=10s, as deploy/systemd/vllm.service.example; a planned restart, its exit 0
on SIGTERM, starts the next process at once),
the load tester (`vllm-sidecar loadtest`, open loop, the same seeded arrivals in every run) and, when on, the
daemon acting through the exec adapter (`python -m bench.restart_sim`, which restarts the supervised
simulator). A watcher polls the simulator's /health and /metrics to measure downtime: seconds with /health
not answering 200 (dead, exiting, restarting) or with requests running and no token produced (hung).

The load tester stops sending when the server refuses a connection, so the load is re-launched for the time
left once the simulator is back; the arrivals that fell in between count as failed (refused), since a client
would have sent them to a dead server. Goodput is the output tokens of successful requests per second of the
run; the reference is the same load on the `healthy` scenario, which never fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.process import Child, free_port, http_status, wait_for
from sidecar.parse.exposition import ExpositionError, parse_exposition

RESTART_SEC_S = 10.0  # RestartSec= of deploy/systemd/vllm.service.example
RATE_PER_S = 8.0
REQUEST_TIMEOUT_S = 10.0
LOAD = ("--prompt-tokens", "2000", "--output-tokens", "256", "--timeout", f"{REQUEST_TIMEOUT_S:g}")
WATCH_S = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    duration_s: float
    sim_flags: tuple[str, ...] = ()
    sidecar_flags: tuple[str, ...] = ()
    note: str = ""


# Each failure is compressed from hours into about a minute, so the sidecar's clocks are compressed with it: a
# forecast may act after 5 s of uptime (not 10 min), a hang is one after 10 s without progress (not 2 min),
# and a stall pauses admission after 2 s (not 10 s).
SCENARIOS: dict[str, Scenario] = {
    "burst": Scenario(name="burst", duration_s=25.0),
    "leak": Scenario(
        name="leak",
        duration_s=65.0,
        # 16 MiB per finished request (the preset: 12) so that it dies within the run at this load, ~55 s in.
        sim_flags=("--leak-bytes-per-request", str(16 * 2**20)),
        sidecar_flags=("--forecast-min-uptime", "5", "--drain-timeout", "10"),
    ),
    "tenant": Scenario(
        name="tenant",
        duration_s=20.0,
        note="the preset's tenant takes 6 GiB after 5 s: free memory under 5 %, but vLLM's own reserve intact",
    ),
    "hang": Scenario(
        name="hang",
        duration_s=45.0,
        sim_flags=("--hang-after-s", "15"),
        sidecar_flags=(
            "--hung-after",
            "10",
            "--stall-pause-after",
            "2",
            "--drain-timeout",
            "5",
            "--probe-timeout",
            "2",
        ),
        note="every simulator process hangs 15 s after its first request, the restarted one too",
    ),
}
HEALTHY = Scenario(name="healthy", duration_s=20.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficacyRun:
    scenario: str
    sidecar: bool
    duration_s: float
    elapsed_s: float  # the load's duration plus the requests still running at its end
    crashes: int
    planned_restarts: int
    arrivals: int
    succeeded: int
    failed: int  # errors, timeouts, refused connections, and arrivals while no load could be sent
    not_admitted: int  # held back by /readyz 503, as a router would
    output_tokens: int
    downtime_s: float

    @property
    def goodput_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s


class Supervisor(threading.Thread):
    """Keeps one simulator running: Restart=on-failure after RESTART_SEC_S; at once after a clean exit."""

    def __init__(self, args: list[str], workdir: Path, pidfile: Path) -> None:
        super().__init__(daemon=True)
        self._args = args
        self._workdir = workdir
        self._pidfile = pidfile
        self._halt = threading.Event()
        self._child: Child | None = None
        self.crashes = 0
        self.planned = 0

    def run(self) -> None:
        starts = 0
        while not self._halt.is_set():
            starts += 1
            child = Child(self._args, self._workdir / f"sim-{starts}.log")
            self._child = child
            self._pidfile.write_text(str(child.pid))
            while child.process.poll() is None and not self._halt.is_set():
                time.sleep(0.02)
            if self._halt.is_set():
                return
            if child.process.returncode == 0:
                self.planned += 1
                continue
            self.crashes += 1
            self._halt.wait(RESTART_SEC_S)

    def stop(self) -> None:
        self._halt.set()
        if self._child is not None:
            self._child.stop()
        self.join(timeout=15)


class Watch(threading.Thread):
    """Adds up the seconds vLLM could not serve: /health not 200, or requests running without progress; and
    keeps each stretch without progress (a hang) as (first poll that saw it, first poll after it), monotonic."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._halt = threading.Event()
        self.downtime_s = 0.0
        self.until_s: float | None = None
        self.stalls: list[tuple[float, float]] = []

    def _progress(self, client: httpx.Client) -> tuple[float, float] | None:
        try:
            text = client.get(self._url + "/metrics").text
            exposition = parse_exposition(text, {"vllm:generation_tokens_total", "vllm:num_requests_running"})
        except (httpx.HTTPError, ExpositionError):
            return None
        tokens = sum(sample.value for sample in exposition.get("vllm:generation_tokens_total"))
        running = sum(sample.value for sample in exposition.get("vllm:num_requests_running"))
        return tokens, running

    def run(self) -> None:
        previous_tokens: float | None = None
        last = time.monotonic()
        stalled_since: float | None = None
        with httpx.Client(timeout=1.0) as client:
            while not self._halt.wait(WATCH_S):
                now = time.monotonic()
                # After the load's window, its tail: no downtime counted, but a hang still tells what the
                # requests sent within the window that were running then died of.
                in_window = self.until_s is None or now <= self.until_s
                healthy = http_status(self._url + "/health") == httpx.codes.OK
                progress = self._progress(client) if healthy else None
                stalled = False
                if progress is not None:
                    tokens, running = progress
                    stalled = running > 0 and previous_tokens is not None and tokens == previous_tokens
                    previous_tokens = tokens
                else:
                    previous_tokens = None
                if (not healthy or stalled) and in_window:
                    self.downtime_s += now - last
                if stalled and stalled_since is None:
                    stalled_since = now - WATCH_S / 2  # it stopped between this poll and the one before
                elif not stalled and stalled_since is not None:
                    self.stalls.append((stalled_since, now))
                    stalled_since = None
                last = now
        if stalled_since is not None:
            self.stalls.append((stalled_since, time.monotonic()))  # still hung when the run ended

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


@dataclass(slots=True)
class LoadTotals:
    arrivals: int = 0
    succeeded: int = 0
    failed: int = 0
    not_admitted: int = 0
    output_tokens: int = 0
    sending_s: float = 0.0
    reports: list[dict[str, Any]] = field(default_factory=list)

    def outcome(
        self,
        scenario: str,
        *,
        sidecar: bool,
        duration_s: float,
        elapsed_s: float,
        supervisors: tuple[Supervisor, ...],
        downtime_s: float,
    ) -> EfficacyRun:
        return EfficacyRun(
            scenario=scenario,
            sidecar=sidecar,
            duration_s=duration_s,
            elapsed_s=elapsed_s,
            crashes=sum(each.crashes for each in supervisors),
            planned_restarts=sum(each.planned for each in supervisors),
            arrivals=self.arrivals,
            succeeded=self.succeeded,
            failed=self.failed,
            not_admitted=self.not_admitted,
            output_tokens=self.output_tokens,
            downtime_s=downtime_s,
        )


def drive_load(sim_url: str, readiness_url: str | None, duration_s: float, totals: LoadTotals) -> None:
    """The loadtest for `duration_s`, re-launched for the time left whenever it stops early (a dead server).

    Arrivals that fell while no load tester was sending (the server down, or coming back) are counted as
    failed: a client would have sent them to a server that refused them.
    """
    started = time.monotonic()
    segment = 0
    while (left := duration_s - (time.monotonic() - started)) > 0.5:
        if http_status(sim_url + "/health") != httpx.codes.OK:
            time.sleep(0.2)
            continue
        argv = [sys.executable, "-m", "sidecar", "loadtest", "--url", sim_url, "--json", "--quiet"]
        argv += ["--rate", str(RATE_PER_S), "--duration", f"{left:.2f}", "--seed", str(segment), *LOAD]
        if readiness_url is not None:
            argv += ["--readiness-url", readiness_url]
        segment += 1
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        try:
            report = json.loads(out)
        except ValueError:
            continue  # it could not start (the server went away between the check and its probe)
        totals.reports.append(report)
        requests = report["requests"]
        held = requests["failures"].get("not_ready", 0)
        totals.arrivals += requests["total"]
        totals.succeeded += requests["succeeded"]
        totals.not_admitted += held
        totals.failed += requests["failed"] - held
        totals.output_tokens += report["throughput"]["output_tokens"] or 0
        totals.sending_s += report.get("sending_s") or 0.0
    missed = round(max(0.0, duration_s - totals.sending_s) * RATE_PER_S)
    totals.arrivals += missed
    totals.failed += missed


def run_scenario(scenario: Scenario, *, sidecar: bool, duration_s: float | None = None) -> EfficacyRun:
    duration = duration_s if duration_s is not None else scenario.duration_s
    with tempfile.TemporaryDirectory(prefix=f"vllm-sidecar-efficacy-{scenario.name}-") as tmp:
        workdir = Path(tmp)
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        pidfile = workdir / "sim.pid"
        sim_args = ["sim", "--listen", f"127.0.0.1:{sim_port}", "--scenario", scenario.name, *scenario.sim_flags]
        supervisor = Supervisor(sim_args, workdir, pidfile)
        supervisor.start()
        daemon: Child | None = None
        watch = Watch(sim_url)
        try:
            wait_for(lambda: http_status(sim_url + "/health") == httpx.codes.OK, 30, "the simulator")
            readiness_url = None
            if sidecar:
                port = free_port()
                restart = f"{sys.executable} -m bench.restart_sim {pidfile}"
                daemon = Child(
                    [
                        *("run", "--vllm-url", sim_url, "--gpu-source", "sim", "--listen", f"127.0.0.1:{port}"),
                        *("--interval", "1", "--state-dir", str(workdir / "state"), "--log-format", "json"),
                        *("--actuator", "exec", "--exec-command", restart, *scenario.sidecar_flags),
                    ],
                    workdir / "daemon.log",
                )
                readiness_url = f"http://127.0.0.1:{port}/readyz"
                wait_for(lambda: http_status(readiness_url) == httpx.codes.OK, 30, "the daemon to admit traffic")
            totals = LoadTotals()
            started = time.monotonic()
            watch.until_s = started + duration
            watch.start()
            drive_load(sim_url, readiness_url, duration, totals)
            elapsed = time.monotonic() - started
        finally:
            watch.stop() if watch.is_alive() else None
            if daemon is not None:
                daemon.stop()
            supervisor.stop()
        return totals.outcome(
            scenario.name,
            sidecar=sidecar,
            duration_s=duration,
            elapsed_s=elapsed,
            supervisors=(supervisor,),
            downtime_s=watch.downtime_s,
        )
