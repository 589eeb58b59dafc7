"""A server that answers at --vllm-url but is not vLLM (a web server, the wrong port) is said to be that, with
what it answered, by `once`, the daemon and `loadtest`; "NOT reachable" stays for a server that does not answer.
The policy's reading is unchanged: not vLLM is not healthy (fail closed). Real loopback servers throughout."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.loadtest.command import add_arguments, run
from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import Behaviour, LoopbackServer, respond

NO_VLLM_SERIES = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"


def _once(url: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "once", "--vllm-url", url, "--gpu-source", "none"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=environment,
    )


def test_once_says_a_web_server_answers_but_is_not_vllm(server: LoopbackServer) -> None:
    result = _once(server.url)  # nothing routed: 404 on every path, as from a plain web server

    said = f"{server.url} answers, but is not vLLM: /metrics answered HTTP 404"
    assert result.returncode == 1
    assert result.stdout.splitlines()[:2] == [f"{server.url} answers, but is not vLLM", f"  problem: {said}"]
    assert result.stderr == f"vllm-sidecar: error: cannot read vLLM: {said}\n"
    assert "reachable" not in result.stdout


@pytest.mark.parametrize(
    ("version", "first_line", "problem"),
    [
        (
            None,
            "{url} answers, but is not vLLM",
            "{url} answers, but is not vLLM: its /metrics has no vllm: series and /version no version",
        ),
        (  # vLLM with --disable-log-stats: no vllm: series, but /version names it
            b'{"version": "0.32.0"}',
            "vLLM {url}: reachable, version 0.32.0, schema no-vllm-metrics",
            "vLLM /metrics has no vllm: metric family (is vLLM started with --disable-log-stats?): nothing about "
            "the engine can be derived",
        ),
    ],
)
def test_once_tells_metrics_without_vllm_series_by_version(
    server: LoopbackServer, version: bytes | None, first_line: str, problem: str
) -> None:
    server.routes["/metrics"] = respond(body=NO_VLLM_SERIES)
    if version is not None:
        server.routes["/version"] = respond(body=version, content_type="application/json")

    result = _once(server.url)

    lines = result.stdout.splitlines()
    assert lines[0] == first_line.format(url=server.url), result.stdout
    assert f"  problem: {problem.format(url=server.url)}" in lines


def test_the_daemon_logs_and_reports_a_server_that_is_not_vllm(server: LoopbackServer, tmp_path: Path) -> None:
    sidecar = SidecarProcess(
        ["--vllm-url", server.url, "--gpu-source", "none", "--state-dir", str(tmp_path)], tmp_path / "sidecar.log"
    )
    try:
        sidecar.wait_ready()
        status = sidecar.get("/status").json()
        readiness = sidecar.get("/readyz").text
    finally:
        sidecar.stop()

    said = f"{server.url} answers, but is not vLLM: /metrics answered HTTP 404"
    failures = [event["error"] for event in sidecar.events() if event["event"] == "source_failed"]
    assert failures == [said]
    assert status["sources"]["vllm"]["error"] == said
    assert status["vllm"]["reachable"] is False  # the contract's field: no vLLM reading (policy: not healthy)
    assert status["policy"]["ready"] is False
    assert readiness.startswith("not ready, not vLLM ("), readiness


def _loadtest(url: str) -> int:
    parser = argparse.ArgumentParser(prog="vllm-sidecar loadtest")
    add_arguments(parser)
    return int(run(parser.parse_args(["--url", url, "--concurrency", "1", "--max-requests", "1"])))


@pytest.mark.parametrize(
    ("models", "said"),
    [
        (None, "/v1/models answered HTTP 404 (no OpenAI-compatible API there)"),
        (
            respond(body=b"<html>hello</html>", content_type="text/html"),
            "/v1/models is not an OpenAI model list ('<html>hello</html>')",
        ),
    ],
)
def test_loadtest_says_a_server_that_is_not_vllm_rather_than_ask_for_a_model(
    server: LoopbackServer, capsys: pytest.CaptureFixture[str], models: Behaviour | None, said: str
) -> None:
    if models is not None:
        server.routes["/v1/models"] = models

    assert _loadtest(server.url) == 2

    _, err = capsys.readouterr()
    assert err == f"vllm-sidecar: error: {server.url} answers, but is not vLLM: {said}\n"
    assert server.hits == ["/v1/models"]  # nothing sent
