"""Efficacy in a fleet: two replicas behind a router that honours readiness, one of them failing. Does I/O.

What the sidecar's pause is for: a Service (or any router that follows readiness) stops sending to the
replica that paused, and the others serve its share. On one replica (bench.efficacy) every held request
counts as lost; here it is served by the other replica, and only what actually failed is lost.

Each replica is a simulator under its own supervisor (bench.efficacy.Supervisor: systemd's Restart=), with,
when on, its own sidecar acting through the exec adapter (A's with the scenario's compressed clocks, B's with
the defaults). Replica A runs the scenario, replica B the healthy preset; the router (bench.router) probes
them as the shipped manifests do. The load is the single-replica bench's, 8 requests/s in all, so each
replica normally gets 4: provisioned so that one replica alone can carry the whole load (N+1), which a single
simulator does at 8 requests/s. Load-driven failures are scaled to A's share (three times the burst's memory
per context token, twice the leak per request), so that they strike within the run as they do on one replica
at 8 requests/s. The reference is the same fleet with both replicas healthy, for the same time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bench.efficacy import (
    REQUEST_TIMEOUT_S,
    SCENARIOS,
    EfficacyRun,
    LoadTotals,
    Scenario,
    Supervisor,
    Watch,
    drive_load,
)
from bench.process import Child, free_port, http_status, wait_for
from bench.router import Replica, Routed, Router, replica

# The single-replica scenarios (their compressed clocks included), with load-driven failures scaled to A's half.
FLEET_SCENARIOS: dict[str, Scenario] = {
    "burst": replace(
        SCENARIOS["burst"],
        sim_flags=("--activation-bytes-per-context-token", str(216 * 1024)),
        note="three times the preset's memory per context token: A's 4 requests/s fill it as 8 do on one replica",
    ),
    "leak": replace(
        SCENARIOS["leak"],
        sim_flags=("--leak-bytes-per-request", str(32 * 2**20)),
        note="twice the single-replica bench's leak per request, for half the requests",
    ),
    "tenant": SCENARIOS["tenant"],
    "hang": replace(SCENARIOS["hang"], note="A hangs 15 s after its first request, every restarted process too"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Lost:
    """The completions a replica did not answer within the client's timeout; A's by when they were sent to it."""

    in_flight_at_a_hang: int  # sent before A's engine stopped, still running when it did: no sidecar saves these
    sent_while_hung: int  # sent after it stopped, before it made progress again: what a pause reaching the router saves
    other_on_a: int  # anything else on A (a restart's gap, an answer later than the timeout)
    on_b: int  # B's, carrying A's share on top of its own (one replica at its capacity times some out)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetRun:
    run: EfficacyRun  # crashes and restarts of both replicas; downtime of A, the failing one
    unrouted: int  # requests the router answered 503: no replica was ready
    sent_to_a: int
    sent_to_b: int
    lost: Lost
    hangs: int  # stretches without progress on A with requests running, as the watcher saw them


def lost(routed: list[Routed], stalls: list[tuple[float, float]]) -> Lost:
    """Attribute each completion A failed to the hangs (start, end) the watcher saw; count B's."""
    in_flight = sent_while_hung = other = on_b = 0
    for each in routed:
        if each.answered_s is not None and each.answered_s - each.sent_s <= REQUEST_TIMEOUT_S:
            continue
        if each.replica != 0:
            on_b += 1
        elif any(start - REQUEST_TIMEOUT_S < each.sent_s < start for start, _ in stalls):
            in_flight += 1
        elif any(start <= each.sent_s < end for start, end in stalls):
            sent_while_hung += 1
        else:
            other += 1
    return Lost(in_flight_at_a_hang=in_flight, sent_while_hung=sent_while_hung, other_on_a=other, on_b=on_b)


class _Member:
    """One replica: a supervised simulator and, when on, its sidecar."""

    def __init__(self, workdir: Path, scenario: str, sim_flags: tuple[str, ...]) -> None:
        self.workdir = workdir
        workdir.mkdir()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.pidfile = workdir / "sim.pid"
        args = ["sim", "--listen", f"127.0.0.1:{port}", "--scenario", scenario, *sim_flags]
        self.supervisor = Supervisor(args, workdir, self.pidfile)
        self.daemon: Child | None = None
        self.readyz: str | None = None

    def start(self) -> None:
        self.supervisor.start()
        wait_for(lambda: http_status(self.url + "/health") == httpx.codes.OK, 30, "a simulator")

    def start_sidecar(self, flags: tuple[str, ...]) -> None:
        port = free_port()
        restart = f"{sys.executable} -m bench.restart_sim {self.pidfile}"
        self.daemon = Child(
            [
                *("run", "--vllm-url", self.url, "--gpu-source", "sim", "--listen", f"127.0.0.1:{port}"),
                *("--interval", "1", "--state-dir", str(self.workdir / "state"), "--log-format", "json"),
                *("--actuator", "exec", "--exec-command", restart, *flags),
            ],
            self.workdir / "daemon.log",
        )
        readyz = f"http://127.0.0.1:{port}/readyz"
        wait_for(lambda: http_status(readyz) == httpx.codes.OK, 30, "a sidecar to admit traffic")
        self.readyz = readyz

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.supervisor.stop()


def run_fleet(scenario: Scenario, *, sidecar: bool, duration_s: float | None = None) -> FleetRun:
    duration = duration_s if duration_s is not None else scenario.duration_s
    with tempfile.TemporaryDirectory(prefix=f"vllm-sidecar-fleet-{scenario.name}-") as tmp:
        failing = _Member(Path(tmp) / "a", scenario.name, scenario.sim_flags)
        healthy = _Member(Path(tmp) / "b", "healthy", ())
        members = (failing, healthy)
        router: Router | None = None
        watch = Watch(failing.url)
        try:
            for member in members:
                member.start()
            if sidecar:
                # The compressed clocks are for A's failure; on B, with --forecast-min-uptime 5, the memory
                # its simulator adds as A's share arrives looked like a leak and drew a planned restart.
                failing.start_sidecar(scenario.sidecar_flags)
                healthy.start_sidecar(())
            replicas: list[Replica] = [replica(member.url, member.readyz) for member in members]
            router = Router(replicas).start()
            totals = LoadTotals()
            started = time.monotonic()
            watch.until_s = started + duration
            watch.start()
            drive_load(router.url, None, duration, totals)
            elapsed = time.monotonic() - started
        finally:
            watch.stop() if watch.is_alive() else None
            if router is not None:
                router.stop()
            for member in members:
                member.stop()
    run = totals.outcome(
        scenario.name,
        sidecar=sidecar,
        duration_s=duration,
        elapsed_s=elapsed,
        supervisors=tuple(member.supervisor for member in members),
        downtime_s=watch.downtime_s,
    )
    return FleetRun(
        run=run,
        unrouted=router.unrouted,
        sent_to_a=replicas[0].sent,
        sent_to_b=replicas[1].sent,
        lost=lost(router.routed, watch.stalls),
        hangs=len(watch.stalls),
    )
