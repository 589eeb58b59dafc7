"""CPU time per tick and peak RSS of the real daemon polling loopback vLLM stand-ins.

Does I/O: starts `vllm-sidecar run` subprocesses, one per case, each against its own stand-in (bench.standin),
and reads their CPU time and peak RSS (VmHWM) from /proc. A Prometheus scrape of the daemon's own /metrics
every 15 s, with the Accept header Prometheus sends (so in OpenMetrics), is part of the cost, as it would be in
production.

The cases run side by side by default: each daemon is idle almost all the time and CPU time is counted per
process, so they hardly disturb one another, and the whole matrix takes one steady-state window instead of
one per case. `serial=True` runs them one at a time.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.process import Child, cpu_seconds, free_port, peak_rss_mb, wait_for
from bench.standin import StandIn

PROMETHEUS_SCRAPE_S = 15.0
PROMETHEUS_ACCEPT = (  # what Prometheus 2.42 sends (scrape/scrape.go, acceptHeader): OpenMetrics first
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
WARMUP_TICKS = 3  # start-up and the first ticks (imports, window fill) are not steady state


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonCase:
    key: str  # which exposition: "300 KB", "sim-8"
    label: str
    metrics: bytes
    interval_s: float
    gpu_document: bytes | None = None  # the simulator's /sim/gpu answer; None: no GPU source


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonCost:
    case: DaemonCase
    ticks: int
    seconds: float
    cpu_ms_per_tick: float
    cpu_share_of_one_core: float
    peak_rss_mb: float
    requests_per_tick: float  # every request the daemon sent to the stand-in, per tick


class _Running:
    def __init__(self, case: DaemonCase, workdir: Path) -> None:
        self.case = case
        self.stand_in = StandIn(metrics=case.metrics, gpu_document=case.gpu_document).start()
        self.port = free_port()
        gpu = ["--gpu-source", "sim"] if case.gpu_document is not None else ["--gpu-source", "none"]
        self.child = Child(
            [
                "run",
                *("--vllm-url", self.stand_in.url, "--listen", f"127.0.0.1:{self.port}"),
                *("--interval", str(case.interval_s), "--log-level", "warning", *gpu),
                *("--state-dir", str(workdir / "state")),
            ],
            workdir / "daemon.log",
        )
        self.cpu_start = 0.0
        self.ticks_start = 0
        self.requests_start = 0
        self.started_s = 0.0

    def ticks(self) -> int:
        return self.stand_in.count("/metrics")

    def requests(self) -> int:
        return sum(self.stand_in.hits.values())

    def begin(self) -> None:
        self.cpu_start = cpu_seconds(self.child.pid)
        self.ticks_start = self.ticks()
        self.requests_start = self.requests()
        self.started_s = time.monotonic()

    def scrape(self) -> None:
        httpx.get(f"http://127.0.0.1:{self.port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5)

    def result(self) -> DaemonCost:
        cpu = cpu_seconds(self.child.pid) - self.cpu_start
        elapsed = time.monotonic() - self.started_s
        ticks = max(self.ticks() - self.ticks_start, 1)
        return DaemonCost(
            case=self.case,
            ticks=ticks,
            seconds=elapsed,
            cpu_ms_per_tick=cpu * 1000 / ticks,
            cpu_share_of_one_core=cpu / elapsed,
            peak_rss_mb=peak_rss_mb(self.child.pid),
            requests_per_tick=(self.requests() - self.requests_start) / ticks,
        )

    def stop(self) -> None:
        self.child.stop()
        self.stand_in.stop()


def _ticks_wanted(case: DaemonCase, min_ticks: int, min_s: float) -> int:
    return max(min_ticks, math.ceil(min_s / case.interval_s))


def measure_daemons(
    cases: list[DaemonCase], *, min_ticks: int = 8, min_s: float = 20.0, serial: bool = False
) -> list[DaemonCost]:
    """Steady-state cost of each case over whole ticks: at least `min_ticks` of them and `min_s` seconds.

    A window opens half an interval after one poll and closes half an interval after the poll that ends
    it, so it holds exactly that many whole ticks (each poll takes milliseconds, the interval seconds).
    """
    if serial:
        return [cost for case in cases for cost in measure_daemons([case], min_ticks=min_ticks, min_s=min_s)]
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-bench-") as tmp:
        running: list[_Running] = []
        try:
            for index, case in enumerate(cases):
                workdir = Path(tmp) / f"case-{index}"
                workdir.mkdir()
                running.append(_Running(case, workdir))
            return _measure(running, min_ticks=min_ticks, min_s=min_s)
        finally:
            for run in running:
                run.stop()


def _measure(running: list[_Running], *, min_ticks: int, min_s: float) -> list[DaemonCost]:
    for run in running:
        wait_for(
            lambda run=run: run.ticks() >= WARMUP_TICKS or not run.child.alive(),  # type: ignore[misc]
            30 + WARMUP_TICKS * run.case.interval_s,
            f"the daemon of {run.case.label} to poll",
        )
        if not run.child.alive():
            raise RuntimeError(f"the daemon of {run.case.label} exited:\n{run.child.log_tail()}")
    seen = [run.ticks() for run in running]
    last_tick_at = [0.0] * len(running)
    begin_at: list[float | None] = [None] * len(running)
    end_at: list[float | None] = [None] * len(running)
    results: dict[int, DaemonCost] = {}
    next_scrape = time.monotonic() + PROMETHEUS_SCRAPE_S
    while len(results) < len(running):
        time.sleep(0.01)
        now = time.monotonic()
        if now >= next_scrape:
            for run in running:
                run.scrape()
            next_scrape += PROMETHEUS_SCRAPE_S
        for index, run in enumerate(running):
            if index in results:
                continue
            half = run.case.interval_s / 2
            ticks = run.ticks()
            if ticks != seen[index]:
                seen[index], last_tick_at[index] = ticks, now
                if begin_at[index] is None:
                    begin_at[index] = now + half
                elif run.started_s and ticks - run.ticks_start >= _ticks_wanted(run.case, min_ticks, min_s):
                    end_at[index] = now + half
            if not run.started_s and begin_at[index] is not None and now >= (begin_at[index] or 0.0):
                run.begin()
            finish = end_at[index]
            if finish is not None and now >= finish:
                results[index] = run.result()
    return [results[index] for index in range(len(running))]
