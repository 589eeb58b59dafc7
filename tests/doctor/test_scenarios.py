"""The labelled scenario set end to end: real simulator processes on loopback, real load, real `doctor` runs.

Every simulator starts at once and every load runs at once (they are independent), then `doctor --json` runs
against each row's simulator and the diagnosis is asserted exactly against `scenarios.ROWS`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.derive.settings import DeriveSettings
from tests.adapters.daemon_process import SidecarProcess
from tests.doctor import oracle
from tests.doctor.harness import DoctorRun, finish, start_doctor, summary
from tests.doctor.scenarios import ROWS, Oracle, Row, SimSpec, Value
from tests.scenarios.harness import SimProcess, loadtest_report, start_loadtest, start_sidecar

SIM_UTILIZATION = 0.9  # every started row keeps the simulator's default
MIN_TREND_SPAN_S = DeriveSettings().min_trend_span_s  # the seconds of polls a memory trend needs to forecast


@dataclass
class Started:
    spec: SimSpec
    sim: SimProcess
    daemon: SidecarProcess | None = None
    metrics: str = ""
    gpu: dict[str, Any] | None = None
    # A refused row's doctor is pointed at a port held bound (connections to it are refused) for the whole
    # test: the exited simulator's own port is free again, and another test's server could take it meanwhile.
    nothing_listening: socket.socket | None = None

    @property
    def doctor_url(self) -> str:
        if self.nothing_listening is None:
            return self.sim.url
        return f"http://127.0.0.1:{self.nothing_listening.getsockname()[1]}"


@dataclass(frozen=True)
class Outcome:
    run: DoctorRun
    oracles: dict[Oracle, Value]


def _start(spec: SimSpec, directory: Path) -> Started:
    assert spec.args[0] == "--scenario"
    return Started(spec=spec, sim=SimProcess(spec.args[1], directory / f"{spec.key}.log", *spec.args[2:]))


def _wait_for_forecast(daemon: SidecarProcess, timeout_s: float = MIN_TREND_SPAN_S + 60.0) -> None:
    """Until the daemon's memory trend forecasts an OOM: it needs a growing line over MIN_TREND_SPAN_S of polls
    from the daemon's start, which the loads may not have lasted (and polls come late on a busy box)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
            if daemon.get("/status").json()["gpus"][0]["time_to_oom_seconds"] is not None:
                return
        time.sleep(0.25)
    raise AssertionError("the daemon never forecast an OOM for the leak")


def _doctor_args(row: Row, started: Started) -> list[str]:
    args = ["--json", "--vllm-url", started.doctor_url, "--gpu-source", row.gpu_source, "--timeout", "10"]
    if row.with_log:
        args += ["--vllm-log", str(started.sim.log_path)]
    if started.daemon is not None:
        args += ["--history", started.daemon.url + "/status"]
    return args


def _oracles(started: Started) -> dict[Oracle, Value]:
    values: dict[Oracle, Value] = {}
    if started.metrics:
        timeout = oracle.shutdown_timeout(started.metrics)
        values[Oracle.SHUTDOWN] = timeout
        values[Oracle.GRACE] = timeout + 30
    if started.gpu is not None:
        utilization, severity = oracle.gpu_expectations(started.gpu, SIM_UTILIZATION)
        values[Oracle.UTILIZATION] = utilization
        values[Oracle.SEVERITY] = severity
    return values


def _bring_up(started: dict[str, Started], directory: Path) -> None:
    """Every simulator healthy (or refused, as its row expects), and the daemons watching theirs."""
    for run in started.values():
        if run.spec.starts:
            run.sim.wait_healthy(timeout_s=60)
        else:
            assert run.sim.wait_exit(timeout_s=60) == 1, run.sim.log()
            run.nothing_listening = socket.socket()
            run.nothing_listening.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    for run in started.values():
        if run.spec.daemon:
            # The default interval, not the harness's 0.5 s: a poll that outlasts its timeout (80 % of the interval)
            # restarts the memory trend, and with 13 doctors starting at once on a busy box 0.4 s is not enough.
            run.daemon = start_sidecar(run.sim.url, directory / f"{run.spec.key}-daemon.log", "--interval", "2")


def _observe(run: Started) -> None:
    """What the oracles need, read once the load is over and the simulator is still."""
    if run.daemon is not None:
        _wait_for_forecast(run.daemon)
    if run.spec.starts:
        run.metrics = httpx.get(run.sim.url + "/metrics", timeout=10).text
        run.gpu = httpx.get(run.sim.url + "/sim/gpu", timeout=10).json()


def _stop(started: dict[str, Started], loads: dict[str, subprocess.Popen[str]]) -> None:
    for load in loads.values():
        if load.poll() is None:  # a failure above left it running: our own child, by its handle
            load.kill()
            load.wait()
    for run in started.values():
        if run.daemon is not None:
            run.daemon.kill()
        run.sim.stop()
        if run.nothing_listening is not None:
            run.nothing_listening.close()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    directory = tmp_path_factory.mktemp("doctor-scenarios")
    specs = {row.sim.key: row.sim for row in ROWS}
    started = {key: _start(spec, directory) for key, spec in specs.items()}
    loads: dict[str, subprocess.Popen[str]] = {}
    try:
        _bring_up(started, directory)
        loads.update(
            (key, start_loadtest(run.sim.url, *run.spec.load)) for key, run in started.items() if run.spec.load
        )
        for key, load in loads.items():
            code, report = loadtest_report(load, timeout_s=180)
            # The request counts whole (failures by kind, the first errors): the report's repr is cut short.
            assert code == 0, (key, report.get("requests"), report.get("verdict_line"))
        for run in started.values():
            _observe(run)
        doctors = {row.name: start_doctor(*_doctor_args(row, started[row.sim.key])) for row in ROWS}
        yield {row.name: Outcome(run=finish(doctors[row.name]), oracles=_oracles(started[row.sim.key])) for row in ROWS}
    finally:
        _stop(started, loads)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_scenario_diagnosis(row: Row, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[row.name]
    run = outcome.run
    assert run.document is not None, (run.stdout, run.stderr)
    document = run.document
    expected = [
        (
            finding.cause,
            oracle.resolve(finding.severity, outcome.oracles),
            tuple((flag, oracle.resolve(value, outcome.oracles)) for flag, value in finding.recommendations),
        )
        for finding in row.findings
    ]
    assert summary(document) == expected, document
    assert run.code == row.exit_code, (run.stderr, document)
    assert document["vllm"] == {"version": row.version, "reachable": row.reachable, "url": run_url(document)}
    assert document["diagnosable"] is True
    for finding, wanted in zip(document["findings"], row.findings, strict=True):
        assert finding["evidence"], finding
        assert all(recommendation["why"] for recommendation in finding["recommendations"]), finding
        for text in wanted.evidence_contains:
            assert any(text in line for line in finding["evidence"]), (text, finding["evidence"])
    for text in row.notes_contain:
        assert any(text in note for note in document["notes"]), (text, document["notes"])


def run_url(document: dict[str, Any]) -> str:
    url = document["vllm"]["url"]
    assert isinstance(url, str)
    assert url.startswith("http://127.0.0.1:")
    return url
