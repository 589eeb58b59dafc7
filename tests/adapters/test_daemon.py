"""The daemon and the CLI as a user runs them: a real process, real HTTP, real signals."""

from __future__ import annotations

import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.doctor_cli.history_reading import status_history
from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, closed_port, respond, vllm_stand_in

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_bytes()


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = vllm_stand_in(CAPTURE)
    yield server
    server.close()


@pytest.fixture
def sidecar(vllm: LoopbackServer, tmp_path: Path) -> Iterator[SidecarProcess]:
    process = SidecarProcess(["--vllm-url", vllm.url, "--interval", "0.5"], tmp_path / "sidecar.log")
    yield process
    process.kill()


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def _polls(vllm: LoopbackServer, count: int) -> None:
    """Wait until the sidecar has asked vLLM for /metrics `count` more times: `count - 1` whole polls from now
    (the first may have read the route as it was)."""
    target = vllm.hits.count("/metrics") + count
    _wait_for(lambda: vllm.hits.count("/metrics") >= target)


def test_serves_metrics_health_readiness_and_status(sidecar: SidecarProcess) -> None:
    sidecar.wait_ready()
    metrics = sidecar.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "vllm_sidecar_up 1.0" in metrics.text
    assert 'vllm_sidecar_kv_cache_capacity_blocks{engine="0",model_name="tiny-llama"} 128.0' in metrics.text
    assert "\nprocess_resident_memory_bytes " in metrics.text  # the sidecar's own process
    openmetrics = httpx.get(
        sidecar.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5
    )
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert openmetrics.text.endswith("# EOF\n")
    assert "vllm_sidecar_up 1.0" in openmetrics.text
    assert 'vllm_sidecar_source_success{source="nvml"}' in metrics.text  # no GPU here: reported, not fatal
    assert sidecar.get("/healthz").status_code == 200
    ready = sidecar.get("/readyz")
    assert (ready.status_code, ready.text) == (200, "ready: admitting traffic\n")
    status = sidecar.get("/status").json()
    assert status["engines"][0]["requests_running"] == 8
    assert status["vllm"]["version"] == "0.32.0"
    # One schema (sidecar/model/status.py): what the daemon serves is what the doctor's reader accepts, key for key.
    history = status_history(status, "live")
    assert history.status is not None
    assert set(history.status) == set(status)
    assert set(history.engines[0]) == set(status["engines"][0])
    assert set(history.status.get("policy") or {}) == set(status["policy"])
    assert sidecar.get("/nope").status_code == 404
    assert httpx.post(sidecar.url + "/metrics", timeout=5).status_code == 405
    head = httpx.head(sidecar.url + "/metrics", timeout=5)
    assert head.status_code == 200
    assert head.content == b""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stops_cleanly_on_signals_within_five_seconds(sidecar: SidecarProcess, signum: int) -> None:
    sidecar.wait_ready()
    code, took_s = sidecar.stop(signum)
    assert code == 0
    assert took_s < 5.0
    events = [event["event"] for event in sidecar.events()]
    assert events[0] == "started"
    assert events[-2:] == ["stopping", "stopped"]


def test_stops_within_five_seconds_even_mid_poll(vllm: LoopbackServer, tmp_path: Path) -> None:
    from tests.loopback import slow

    vllm.routes["/metrics"] = slow(30.0, respond(body=CAPTURE))
    process = SidecarProcess(["--vllm-url", vllm.url, "--interval", "20", "--timeout", "15"], tmp_path / "s.log")
    try:
        _wait_for(lambda: "/metrics" in vllm.hits)
        code, took_s = process.stop()
        assert code == 0
        assert took_s < 5.0
    finally:
        process.kill()


def test_keeps_running_through_vllm_failures_and_logs_each_change_once(
    sidecar: SidecarProcess, vllm: LoopbackServer
) -> None:
    sidecar.wait_ready()
    vllm.routes["/metrics"] = respond(500, b"boom")
    _wait_for(lambda: "vllm_sidecar_up 0.0" in sidecar.get("/metrics").text)
    _polls(vllm, 4)  # several more failing polls
    vllm.routes["/metrics"] = respond(body=b"not an exposition at all")
    _wait_for(lambda: "not a Prometheus text exposition" in json.dumps(sidecar.get("/status").json()))
    vllm.routes["/metrics"] = respond(body=CAPTURE)
    _wait_for(lambda: "vllm_sidecar_up 1.0" in sidecar.get("/metrics").text)
    assert sidecar.get("/healthz").status_code == 200
    vllm_events = [(e["event"], e.get("error")) for e in sidecar.events() if e.get("source") == "vllm"]
    names = [name for name, _ in vllm_events]
    assert names[0] == names[-1] == "source_ok"
    assert set(names[1:-1]) == {"source_failed"}
    errors = [error for _, error in vllm_events[1:-1]]
    # One line per change: a poll that timed out on a busy box is a change too (its own line), a repeat is not.
    assert all(before != after for before, after in itertools.pairwise(errors))
    assert errors[0] == f"vLLM {vllm.url}/metrics answered HTTP 500"
    assert any("not a Prometheus text exposition" in str(error) for error in errors)
    assert len(errors) < len([hit for hit in vllm.hits if hit == "/metrics"]) - 2  # not one line per failing poll


def test_every_kind_of_bad_vllm_answer_is_a_problem_and_the_daemon_stays_up(
    vllm: LoopbackServer, tmp_path: Path
) -> None:
    from tests.loopback import drop_mid_body, endless, slow

    process = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--timeout", "0.4", "--max-response-bytes", "1048576"],
        tmp_path / "s.log",
    )
    try:
        process.wait_ready()
        cases = [
            (slow(2.0, respond(body=CAPTURE)), "did not answer within 0.4 s"),
            (respond(500), "answered HTTP 500"),
            (respond(body=b"<html>oops</html>"), "is not a Prometheus text exposition"),
            (endless(b"vllm:x 1\n" * 1000, limit_bytes=50 * 2**20), "exceeds the 1048576 byte cap"),
            (drop_mid_body(len(CAPTURE), CAPTURE[:1000]), "dropped the connection mid-answer"),
            (respond(body=CAPTURE), None),
        ]
        for behaviour, problem in cases:
            vllm.routes["/metrics"] = behaviour

            def shows(problem: str | None = problem) -> bool:
                status = process.get("/status").json()
                if problem is None:
                    return bool(status["sources"]["vllm"]["ok"])
                return any(problem in line for line in status["problems"])

            _wait_for(shows)
            assert process.get("/healthz").status_code == 200
        assert process.process.poll() is None
    finally:
        process.kill()


def test_a_port_in_use_is_a_clear_error(vllm: LoopbackServer, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "run", "--vllm-url", vllm.url, "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1
    assert '"event": "listen_failed"' in result.stderr


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=full_env,
    )


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["run", "--interval", "-1"], {}, "invalid setting interval='-1': Input should be greater than 0"),
        (["run", "--vllm-url", "localhost:8000"], {}, "invalid setting vllm_url='localhost:8000'"),
        (["run", "--interval", "2", "--timeout", "5"], {}, "invalid setting timeout='5': must be shorter"),
        (["run"], {"VLLM_SIDECAR_INTERVAL": "fast"}, "environment VLLM_SIDECAR_INTERVAL"),
        (["once", "--gpus", "0,0"], {}, "invalid setting gpus='0,0'"),
        (["run", "--log-level", "loud"], {}, "allowed: debug, info, warning or error"),
        (["run", "--resume-kv-usage", "0.95"], {}, "must be below --pause-kv-usage (0.9, the default)"),
        (["run", "--actuator", "systemd", "--systemd-unit", "../etc/x.service"], {}, "invalid setting systemd_unit"),
        (["run", "--actuator", "exec"], {}, "invalid setting actuator='exec': needs --exec-command"),
        (["run", "--exec-command", "'unterminated"], {}, "cannot be split into arguments"),
        (["run", "--webhook-url", "hooks.example/T0KEN"], {}, "invalid setting webhook_url: not an http(s) URL"),
        (["run", "--max-restarts-per-hour", "-1"], {}, "invalid setting max_restarts_per_hour='-1'"),
        (["run", "--stall-pause-after", "0"], {}, "invalid setting stall_pause_after='0'"),
        (["run", "--probe-after", "-1"], {}, "invalid setting probe_after='-1'"),
        (["run", "--vllm-api-key-file", "/nonexistent/key"], {}, "cannot read --vllm-api-key-file /nonexistent/key"),
    ],
)
def test_bad_settings_stop_at_start_with_one_line_and_exit_2(args: list[str], env: dict[str, str], needle: str) -> None:
    result = _cli(*args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("vllm-sidecar: error: ")
    assert needle in lines[0]
    assert "T0KEN" not in result.stderr  # a webhook URL is a secret: never echoed


def test_config_file_precedence_and_unknown_keys(tmp_path: Path, vllm: LoopbackServer) -> None:
    toml = tmp_path / "sidecar.toml"
    toml.write_text(f'vllm-url = "{vllm.url}"\ninterval = 9\ngpu_source = "none"\n')
    result = _cli("once", "--json", "--config", str(toml))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["vllm"]["url"] == vllm.url
    # environment beats the file, a flag beats the environment
    result = _cli("once", "--json", "--config", str(toml), env={"VLLM_SIDECAR_VLLM_URL": "http://127.0.0.1:1"})
    assert json.loads(result.stdout)["vllm"]["url"] == "http://127.0.0.1:1"
    result = _cli(
        "once",
        "--json",
        "--config",
        str(toml),
        "--vllm-url",
        vllm.url,
        env={"VLLM_SIDECAR_VLLM_URL": "http://x:1"},
    )
    assert json.loads(result.stdout)["vllm"]["url"] == vllm.url
    yaml_file = tmp_path / "sidecar.yaml"
    yaml_file.write_text("intervall: 3\n")
    result = _cli("run", "--config", str(yaml_file))
    assert result.returncode == 2
    assert "unknown setting 'intervall' in config file" in result.stderr
    yaml_file.write_text("interval: [1, 2\n")
    result = _cli("run", "--config", str(yaml_file))
    assert result.returncode == 2
    assert "is not valid YAML" in result.stderr
    result = _cli("run", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode == 2
    assert "cannot read config file" in result.stderr


def test_once_json_follows_the_contract(vllm: LoopbackServer) -> None:
    result = _cli("once", "--json", "--vllm-url", vllm.url)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document) == {"vllm", "engines", "gpus", "problems", "models", "allocators"}
    assert document["vllm"] == {
        "url": vllm.url,
        "reachable": True,
        "healthy": True,
        "version": "0.32.0",
        "metric_schema": "v1",
    }
    (engine,) = document["engines"]
    assert set(engine) == {
        "model_name",
        "engine",
        "kv_cache_usage_ratio",
        "kv_cache_capacity_blocks",
        "kv_cache_block_size_tokens",
        "kv_cache_used_blocks",
        "requests_running",
        "requests_waiting",
        "kv_cache_blocks_per_request",
        "kv_cache_request_headroom",
        "kv_cache_fragmentation_ratio",
        "prefix_cache_hit_ratio_lifetime",
        # beyond the contract's fields
        "requests_waiting_capacity",
        "requests_waiting_deferred",
        "engine_healthy",
        "kv_cache_capacity_tokens",
        "kv_cache_free_blocks",
    }
    assert engine["kv_cache_capacity_blocks"] == 128
    assert engine["prefix_cache_hit_ratio_lifetime"] == pytest.approx(1440 / 2708)
    # The capture's 0.8189 = 104 / 127: vLLM 0.32 leaves its null block out of the usage denominator.
    assert engine["kv_cache_used_blocks"] == pytest.approx(104)
    assert engine["kv_cache_free_blocks"] == pytest.approx(23)
    assert (engine["requests_waiting_capacity"], engine["requests_waiting_deferred"]) == (4, 0)
    assert engine["engine_healthy"] is None  # no fault tolerance: unknown, not healthy
    assert engine["kv_cache_capacity_tokens"] == 4096
    assert document["models"] == [
        {
            "model_name": "tiny-llama",
            "admission_rejections_total": 0,
            "admission_rejections_by_reason": {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0},
        }
    ]
    assert any("NVML" in problem for problem in document["problems"])


def test_once_exits_non_zero_with_one_line_when_vllm_cannot_be_read() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = _cli("once", "--json", "--vllm-url", url, "--gpu-source", "none")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"vllm-sidecar: error: cannot read vLLM: vLLM unreachable at {url}/metrics: connection refused"
    ]
    document = json.loads(result.stdout)
    assert document["vllm"]["reachable"] is False
    assert document["engines"] == []
    assert document["problems"] == [f"vLLM unreachable at {url}/metrics: connection refused"]


@pytest.mark.parametrize("command", ["run", "once"])
def test_help_lists_every_setting_of_the_command_and_no_other(command: str) -> None:
    from sidecar.shell.settings import OnceSettings, Settings

    result = _cli(command, "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    own = (Settings if command == "run" else OnceSettings).model_fields
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", result.stdout, re.MULTILINE))
    assert flags == {"--" + name.replace("_", "-") for name in own}
    assert len(result.stdout.splitlines()) <= 100  # two screens of a 80x50 terminal


def test_one_config_file_serves_every_command(tmp_path: Path, vllm: LoopbackServer) -> None:
    """The daemon's file (listen, actuator...) read by `once` and `doctor`: each takes its own keys and leaves the
    daemon's; a key no command has is still refused, with the nearest key of any command suggested."""
    toml = tmp_path / "config.toml"
    toml.write_text(f'vllm-url = "{vllm.url}"\nlisten = "127.0.0.1:1"\nactuator = "exec"\ngpu-source = "none"\n')
    once = _cli("once", "--json", "--config", str(toml))
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["vllm"]["url"] == vllm.url
    doctor = _cli("doctor", "--json", "--config", str(toml))
    assert doctor.returncode != 2, doctor.stderr
    toml.write_text('listn = "127.0.0.1:1"\n')
    refused = _cli("once", "--config", str(toml))
    assert refused.returncode == 2
    assert f"unknown setting 'listn' in config file {toml}; did you mean 'listen'?" in refused.stderr


def test_version() -> None:
    from sidecar import __version__

    result = _cli("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"vllm-sidecar {__version__}")
