"""`vllm-sidecar doctor` as a command: exit codes, one-line errors, bad input of every kind, settings sources.

In process through `sidecar.cli.main` (each call does real HTTP to a loopback server and reads real files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.doctor_cli.gather import _model_max_len
from sidecar.sim.config import SimConfig
from sidecar.sim.logs import preamble_lines, refusal_lines, refusal_message
from tests.conftest import exposition_files
from tests.loopback import LoopbackServer, closed_port, respond

JSON = "application/json"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    loopback = LoopbackServer()
    yield loopback
    loopback.close()


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


def _refusal_log(path: Path) -> Path:
    config = SimConfig(gpu_memory_utilization=0.3, max_model_len=131072)
    message = refusal_message(config, config.derived_num_gpu_blocks)
    assert message is not None
    lines = [*preamble_lines(config, 1.7e9), *refusal_lines(config, message, config.derived_num_gpu_blocks, 1.7e9)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["doctor", "--gpu-source", "none", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unreachable_and_no_log_is_exit_2_with_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code, out, err = _doctor(capsys, "--vllm-url", url)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"vllm-sidecar: error: nothing to diagnose: {url}/metrics unreachable: connection refused;")
    code, out, err = _doctor(capsys, "--vllm-url", url, "--json")
    document = json.loads(out)
    assert (code, document["diagnosable"], document["findings"]) == (2, False, [])
    assert document["vllm"] == {"version": None, "reachable": False, "url": url}


def test_unreachable_but_a_log_given_diagnoses_from_the_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = _refusal_log(tmp_path / "vllm.log")
    code, out, err = _doctor(capsys, "--vllm-url", f"http://127.0.0.1:{closed_port()}", "--vllm-log", str(log))
    assert (code, err) == (1, "")
    assert "[CRITICAL] kv_cache_blowout: vLLM could not start" in out
    assert "    --max-model-len 51296\n" in out


@pytest.mark.parametrize("where", ["missing.log", "."])
def test_a_log_that_cannot_be_read_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str) -> None:
    code, out, err = _doctor(capsys, "--vllm-log", str(tmp_path / where))
    assert (code, out) == (2, "")
    assert err.startswith(f"vllm-sidecar: error: cannot read --vllm-log {tmp_path / where}: ")


@pytest.mark.parametrize(
    "body",
    [b"<html>502 Bad Gateway</html>", b"\xff\xfe\x00garbage", b'vllm:kv_cache_usage_perc{engine="0"} not-a-number'],
)
def test_malformed_metrics_never_crash(
    capsys: pytest.CaptureFixture[str], server: LoopbackServer, tmp_path: Path, body: bytes
) -> None:
    server.routes["/metrics"] = respond(200, body)
    code, out, err = _doctor(capsys, "--vllm-url", server.url)
    assert (code, out) == (2, "")
    assert "/metrics is not a Prometheus text exposition" in err
    code, out, _ = _doctor(capsys, "--vllm-url", server.url, "--vllm-log", str(_refusal_log(tmp_path / "v.log")))
    assert code == 1, "the log still gives a diagnosis"
    assert "answered, but" in out


def test_an_http_error_and_an_oversized_answer_are_problems_not_crashes(
    capsys: pytest.CaptureFixture[str], server: LoopbackServer
) -> None:
    server.routes["/metrics"] = respond(500, b"Internal Server Error")
    code, _, err = _doctor(capsys, "--vllm-url", server.url)
    assert code == 2
    assert "answered HTTP 500" in err


@pytest.mark.parametrize("capture", exposition_files(), ids=lambda path: path.stem)
def test_every_recorded_exposition_from_05_to_032_is_diagnosable(
    capsys: pytest.CaptureFixture[str], server: LoopbackServer, capture: Path
) -> None:
    server.routes["/metrics"] = respond(200, capture.read_bytes())
    code, out, err = _doctor(capsys, "--vllm-url", server.url, "--json")
    document = json.loads(out)
    assert code in (0, 1), err
    assert document["diagnosable"] is True
    assert document["vllm"]["reachable"] is True


def test_disabled_log_stats_is_said_not_taken_for_idle(
    capsys: pytest.CaptureFixture[str], server: LoopbackServer
) -> None:
    capture = next(path for path in exposition_files() if "disable-log-stats" in path.name)
    server.routes["/metrics"] = respond(200, capture.read_bytes())
    server.routes["/version"] = respond(200, b'{"version": "0.32.0"}', JSON)
    code, out, _ = _doctor(capsys, "--vllm-url", server.url, "--json")
    document = json.loads(out)
    assert code == 0
    assert document["vllm"]["version"] == "0.32.0"
    assert any("--disable-log-stats" in note for note in document["notes"])


def test_version_comes_from_vllms_endpoint_and_thin_traffic_is_said(
    capsys: pytest.CaptureFixture[str], server: LoopbackServer
) -> None:
    capture = next(path for path in exposition_files() if path.name == "vllm-0.32.0-cpu-after-load.prom")
    server.routes["/metrics"] = respond(200, capture.read_bytes())
    server.routes["/version"] = respond(200, b'{"version": "0.32.0"}', JSON)
    code, out, _ = _doctor(capsys, "--vllm-url", server.url, "--json")
    document = json.loads(out)
    assert (code, document["findings"]) == (0, [])
    assert document["vllm"]["version"] == "0.32.0"
    assert any(note.startswith("traffic too thin for percentiles: 18 finished requests") for note in document["notes"])


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ({"data": [{"id": "a", "parent": "base", "max_model_len": 99}, {"id": "base", "max_model_len": 8192}]}, 8192),
        ({"data": [{"id": "base", "max_model_len": True}]}, None),
        ({"data": "x"}, None),
        ([], None),
    ],
)
def test_max_model_len_of_the_served_model_not_of_a_lora_adapter(models: object, expected: int | None) -> None:
    assert _model_max_len(models) == expected


def test_garbage_history_is_a_note_and_a_missing_one_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = _refusal_log(tmp_path / "vllm.log")
    garbage = tmp_path / "status.json"
    garbage.write_bytes(b"\x00{not json")
    nothing = f"http://127.0.0.1:{closed_port()}"
    code, out, _ = _doctor(capsys, "--vllm-url", nothing, "--vllm-log", str(log), "--history", str(garbage), "--json")
    document = json.loads(out)
    assert code == 1
    assert any(note.startswith(f"history {garbage} not used:") for note in document["notes"])
    code, _, err = _doctor(capsys, "--vllm-url", nothing, "--history", str(tmp_path / "none"))
    assert code == 2
    assert "cannot read --history" in err
    empty_state_dir = tmp_path / "state"
    empty_state_dir.mkdir()
    code, _, err = _doctor(capsys, "--vllm-url", nothing, "--history", str(empty_state_dir))
    assert code == 2
    assert "cannot read --history" in err


def test_history_from_a_state_dir_ledger(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "restart-ledger.json").write_text(
        json.dumps({"version": 1, "restarts": [{"wall_time_s": 1.0, "reason": "engine_dead"}]})
    )
    log = _refusal_log(tmp_path / "vllm.log")
    nothing = f"http://127.0.0.1:{closed_port()}"
    code, out, _ = _doctor(capsys, "--vllm-url", nothing, "--vllm-log", str(log), "--history", str(tmp_path), "--json")
    assert code == 1
    assert f"history: {tmp_path / 'restart-ledger.json'}" in json.loads(out)["notes"]


def test_options_come_from_the_environment_and_a_config_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _refusal_log(tmp_path / "vllm.log")
    config = tmp_path / "sidecar.toml"
    config.write_text(f'vllm-log = "{log}"\njson = true\n')
    monkeypatch.setenv("VLLM_SIDECAR_VLLM_URL", f"http://127.0.0.1:{closed_port()}")
    code, out, _ = _doctor(capsys, "--config", str(config))
    document = json.loads(out)
    assert code == 1
    assert document["vllm"]["url"] == os.environ["VLLM_SIDECAR_VLLM_URL"]
    assert document["findings"][0]["recommendations"][0] == {
        "flag": "--max-model-len",
        "value": 51296,
        "why": "vLLM's estimate of the longest request its KV cache holds: 51,296 tokens, rounded down to the block "
        "size 16 -> 51296",
    }


@pytest.mark.parametrize("url", ["notaurl", "http://[::1", "http://127.0.0.1:99999", "ftp://x", "http://"])
def test_a_bad_url_is_exit_2_not_a_traceback(capsys: pytest.CaptureFixture[str], url: str) -> None:
    for option in ("--vllm-url", "--history"):
        code, out, err = _doctor(capsys, option, url)
        assert (code, out) == (2, "")
        assert err.startswith(f"vllm-sidecar: error: {option} must be an http:// or https:// URL") or (
            option == "--history" and "cannot read --history" in err
        )


def test_fail_on_and_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = _refusal_log(tmp_path / "vllm.log")
    nothing = f"http://127.0.0.1:{closed_port()}"
    assert _doctor(capsys, "--vllm-url", nothing, "--vllm-log", str(log), "--fail-on", "critical")[0] == 1
    code, _, err = _doctor(capsys, "--vllm-url", nothing, "--gpus", "0,x")
    assert code == 2
    assert "--gpus must be 'all' or a list" in err
    code, _, err = _doctor(capsys, "--vllm-url", nothing, "--timeout", "0")
    assert code == 2
    assert (
        "invalid setting request_timeout='0': Input should be greater than 0; allowed: seconds, > 0 and <= 300" in err
    )
    assert err.rstrip().endswith("(flag --timeout)")


def test_no_nvml_still_diagnoses_and_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = _refusal_log(tmp_path / "vllm.log")
    code = main(["doctor", "--vllm-url", f"http://127.0.0.1:{closed_port()}", "--vllm-log", str(log), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    gpu_note = next(note for note in document["notes"] if note.startswith("GPU"))
    if "device(s) read from nvml" in gpu_note:
        pytest.skip("this machine has a GPU that NVML can read")
    assert gpu_note.startswith("GPU evidence missing (NVML")
