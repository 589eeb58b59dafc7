"""The daemon's acting, as a real process against a scripted vLLM: pausing admission with hysteresis and
dwell time, --dry-run, and the admin API."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, respond, slow

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_text()
USAGE_LINE = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.8188976377952756'
TOKEN = "an-admin-token-for-tests-0123"  # noqa: S105 - a test fixture, not a secret


def _with_usage(value: float) -> bytes:
    assert USAGE_LINE in CAPTURE
    return CAPTURE.replace(USAGE_LINE, USAGE_LINE.rsplit(" ", 1)[0] + f" {value}").encode()


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    server.routes.update(
        {
            "/metrics": respond(body=_with_usage(0.5)),
            "/version": respond(body=b'{"version":"0.32.0"}'),
            "/health": respond(),
        }
    )
    yield server
    server.close()


def _wait_for(predicate: object, timeout_s: float = 20.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def _past_startup_grace(sidecar: SidecarProcess) -> None:
    """Wait until the policy acts. The capture is frozen: its 8 running requests never progress, so from the
    second poll on the stall reads `pressure` (and pauses at --stall-pause-after). `normal` shows for one poll
    at most, and waiting for it raced a busy box."""
    _wait_for(lambda: sidecar.get("/status").json()["policy"]["state"] in ("normal", "pressure"))


def _polls(vllm: LoopbackServer, count: int) -> None:
    """Wait until the sidecar has asked vLLM for /metrics `count` more times: `count - 1` whole polls from now
    (the first may have read the route as it was)."""
    target = vllm.hits.count("/metrics") + count
    _wait_for(lambda: vllm.hits.count("/metrics") >= target)


def _start(vllm: LoopbackServer, tmp_path: Path, *args: str) -> SidecarProcess:
    process = SidecarProcess(
        [
            "--vllm-url",
            vllm.url,
            "--interval",
            "0.5",
            "--gpu-source",
            "none",
            "--state-dir",
            str(tmp_path / "s"),
            *args,
        ],
        tmp_path / "sidecar.log",
    )
    process.wait_ready()
    return process


def test_kv_pressure_pauses_admission_with_hysteresis_and_dwell(vllm: LoopbackServer, tmp_path: Path) -> None:
    # The capture is frozen: its running requests never progress, which after 10 s is a stalled engine, and the
    # stall pause would (rightly) hold admission past the KV resume this test is about.
    sidecar = _start(vllm, tmp_path, "--stall-pause-after", "3600")
    try:
        _past_startup_grace(sidecar)
        vllm.routes["/metrics"] = respond(body=_with_usage(0.95))
        _wait_for(lambda: sidecar.get("/readyz").status_code == 503, 5)
        ready = sidecar.get("/readyz")
        assert ready.text.startswith("paused: ")
        assert "0.95" in ready.text
        metrics = sidecar.get("/metrics").text
        assert "vllm_sidecar_admission_paused 1.0" in metrics
        assert 'vllm_sidecar_policy_state{state="paused"} 1.0' in metrics
        assert 'vllm_sidecar_actions_total{action="pause_admission"} 1.0' in metrics
        vllm.routes["/metrics"] = respond(body=_with_usage(0.85))  # inside the hysteresis band: stays paused
        _polls(vllm, 5)  # four whole polls of 0.85
        assert sidecar.get("/readyz").status_code == 503
        vllm.routes["/metrics"] = respond(body=_with_usage(0.5))
        _wait_for(lambda: sidecar.get("/readyz").status_code == 200, 20)
        assert 'vllm_sidecar_actions_total{action="resume_admission"} 1.0' in sidecar.get("/metrics").text
        recent = sidecar.get("/status").json()["policy"]["recent"]
    finally:
        sidecar.kill()
    # The dwell time on the policy's own clock: the polls at which it paused and resumed.
    stamps = {action: entry["wall_time_s"] for entry in recent for action in entry["actions"]}
    dwell_s = stamps["resume_admission"] - stamps["pause_admission"]
    assert dwell_s >= 10.0 - 1e-3, f"resumed {dwell_s:.3f} s after pausing, before the 10 s dwell time"
    kinds = [
        json.loads(line).get("kind")
        for line in sidecar.log_path.read_text().splitlines()
        if '"event": "notification"' in line
    ]
    assert kinds == ["pause", "resume"]


def test_an_engine_with_requests_running_and_no_progress_pauses_admission(vllm: LoopbackServer, tmp_path: Path) -> None:
    # The same frozen capture: requests running, token and step counters never moving.
    sidecar = _start(vllm, tmp_path, "--stall-pause-after", "2")
    try:
        _wait_for(lambda: sidecar.get("/readyz").status_code == 503, 10)
        reason = sidecar.get("/readyz").text
        assert reason.startswith("paused: ")
        assert "made no progress for" in reason
        assert ">= 2 s with" in reason
        assert sidecar.get("/status").json()["policy"]["state"] == "paused"
    finally:
        sidecar.kill()


def test_dry_run_decides_and_reports_but_never_pauses(vllm: LoopbackServer, tmp_path: Path) -> None:
    vllm.routes["/metrics"] = respond(body=_with_usage(0.97))
    sidecar = _start(vllm, tmp_path, "--dry-run")
    try:
        _wait_for(lambda: sidecar.get("/status").json()["policy"]["state"] == "paused", 10)
        ready = sidecar.get("/readyz")
        assert ready.status_code == 200
        assert "dry run; would pause" in ready.text
        metrics = sidecar.get("/metrics").text
        assert "vllm_sidecar_admission_paused 0.0" in metrics
        assert 'vllm_sidecar_policy_state{state="paused"} 1.0' in metrics
    finally:
        sidecar.kill()
    actions = [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if '"event": "action"' in line]
    assert actions[0]["dry_run"] is True
    assert actions[0]["reason"].startswith("would ")


def test_admin_api_needs_the_token_and_logs_the_caller(vllm: LoopbackServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    # The frozen capture's stall would pause admission at 10 s: moved out of the way.
    sidecar = _start(vllm, tmp_path, "--admin-token-file", str(token_file), "--stall-pause-after", "3600")
    try:
        _past_startup_grace(sidecar)
        pause = sidecar.url + "/admin/pause"
        assert httpx.post(pause, timeout=5).status_code == 401
        assert httpx.post(pause, headers={"Authorization": "Bearer not-the-token-000000"}, timeout=5).status_code == 403
        assert httpx.get(pause, timeout=5).status_code == 405
        answer = httpx.post(pause, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert answer.status_code == 200
        assert "paused by hand" in answer.json()["result"]
        assert sidecar.get("/readyz").status_code == 503
        _polls(vllm, 4)  # a manual pause holds, whatever the metrics say
        assert sidecar.get("/readyz").status_code == 503
        resume = httpx.post(sidecar.url + "/admin/resume", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert resume.status_code == 200
        _wait_for(lambda: sidecar.get("/readyz").status_code == 200, 5)
    finally:
        sidecar.kill()
    log = sidecar.log_path.read_text()
    admin = [json.loads(line) for line in log.splitlines() if '"event": "admin_action"' in line]
    assert [(entry["action"], entry["caller"].split(":")[0]) for entry in admin] == [
        ("pause", "127.0.0.1"),
        ("resume", "127.0.0.1"),
    ]
    assert TOKEN not in log


def test_without_a_token_file_the_admin_api_is_off(vllm: LoopbackServer, tmp_path: Path) -> None:
    sidecar = _start(vllm, tmp_path)
    try:
        answer = httpx.post(sidecar.url + "/admin/restart", headers={"Authorization": "Bearer x" * 3}, timeout=5)
        assert answer.status_code == 403
        assert "admin API is off" in answer.text
    finally:
        sidecar.kill()


def test_pause_is_posted_to_a_signed_webhook(vllm: LoopbackServer, tmp_path: Path) -> None:
    """--webhook-url with --webhook-hmac-key-file: the receiver gets the JSON document, signed."""
    import http.server
    import threading

    from sidecar.notify.payload import verify_signature

    received: list[tuple[dict[str, str], bytes]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(({key.lower(): value for key, value in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key_file = tmp_path / "hmac.key"
    key_file.write_text("a-shared-signing-key")
    hook = f"http://127.0.0.1:{server.server_address[1]}/hooks/S3CRETPATH"
    # The stall pause is moved out of the way, so the one pause is the KV one.
    sidecar = _start(
        vllm, tmp_path, "--webhook-url", hook, "--webhook-hmac-key-file", str(key_file), "--stall-pause-after", "3600"
    )
    try:
        _past_startup_grace(sidecar)
        vllm.routes["/metrics"] = respond(body=_with_usage(0.96))
        _wait_for(lambda: len(received) >= 1, 10)
    finally:
        sidecar.kill()
        server.shutdown()
    headers, body = received[0]
    document = json.loads(body)
    assert document["source"] == "vllm-sidecar"
    assert document["kind"] == "pause"
    assert "0.96" in document["summary"]
    assert verify_signature(
        b"a-shared-signing-key", headers["x-vllm-sidecar-timestamp"], body, headers["x-vllm-sidecar-signature"]
    )
    assert "S3CRETPATH" not in sidecar.log_path.read_text()  # the webhook URL is a secret: never logged


IDLE = (
    b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0\n'
    b'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1234.0\n'
)
MODELS = respond(body=b'{"data":[{"id":"tiny-llama"}]}', content_type="application/json")


def test_an_engine_wedged_while_its_metrics_read_idle_is_probed_paused_and_restarted(
    vllm: LoopbackServer, tmp_path: Path
) -> None:
    # vLLM with its EngineCore stopped while idle: /health 200, /metrics frozen at 0 running and 0 waiting,
    # and a completion never answered.
    vllm.routes.update({"/metrics": respond(body=IDLE), "/v1/models": MODELS, "/v1/completions": slow(30, respond())})
    marker = tmp_path / "restarted"
    sidecar = _start(
        vllm,
        tmp_path,
        "--probe-after", "2", "--probe-timeout", "2", "--stall-pause-after", "1", "--hung-after", "4",
        "--actuator", "exec", "--exec-command", f"touch {marker}",
    )  # fmt: skip
    try:
        _wait_for(lambda: "a 1-token probe completion has had no answer" in sidecar.get("/readyz").text, 15)
        assert sidecar.get("/readyz").status_code == 503
        _wait_for(marker.exists, 15)
        status = sidecar.get("/status").json()["policy"]
        assert status["last_probe"] == "no_answer: no answer within 2 s"
        assert 'vllm_sidecar_probes_total{outcome="no_answer"} 1.0' in sidecar.get("/metrics").text
    finally:
        sidecar.kill()
    events = [json.loads(line) for line in sidecar.log_path.read_text().splitlines() if line.startswith("{")]
    restart = next(e for e in events if e["event"] == "action" and e["action"] == "restart")
    # The time from sending to the tick that read the timeout: the 2 s timeout, more when a tick came late (CI
    # on 2026-11-29 saw 4 s beside the other lanes).
    waited = re.search(r"and a 1-token probe completion got no answer in (\d+) s \(hung\)", str(restart["reason"]))
    assert waited is not None, restart["reason"]
    assert int(waited.group(1)) >= 2
    assert [e["event"] for e in events].count("probe_no_answer") == 1


def test_an_idle_engine_that_answers_the_probe_stays_in_rotation(vllm: LoopbackServer, tmp_path: Path) -> None:
    vllm.routes.update({"/metrics": respond(body=IDLE), "/v1/models": MODELS, "/v1/completions": respond()})
    sidecar = _start(vllm, tmp_path, "--probe-after", "1", "--probe-timeout", "2", "--hung-after", "2")
    try:
        _wait_for(lambda: vllm.hits.count("/v1/completions") >= 3, 15)  # asked again and again: metrics frozen
        assert sidecar.get("/readyz").status_code == 200
        assert sidecar.get("/status").json()["policy"]["state"] == "normal"
    finally:
        sidecar.kill()
    events = [json.loads(line)["event"] for line in sidecar.log_path.read_text().splitlines() if line.startswith("{")]
    assert events.count("probe_answered") == 1  # said once, however many probes
    assert "action" not in events  # no restart, and probes are no action worth a line
