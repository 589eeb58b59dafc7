"""/readyz fails closed, as a load balancer sees it: a real daemon process against real loopback servers that
are not there, not vLLM, vLLM, vLLM whose metrics cannot be read, and vLLM gone."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, closed_port, respond

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_bytes()
VLLM = {"/metrics": respond(body=CAPTURE), "/version": respond(body=b'{"version":"0.32.0"}'), "/health": respond()}


def _ready_until(sidecar: SidecarProcess, check: Callable[[httpx.Response], bool], timeout_s: float = 10.0) -> str:
    """The /readyz body once `check` holds for its answer; fails with the last answer otherwise."""
    deadline = time.monotonic() + timeout_s
    answer = None
    while time.monotonic() < deadline:
        try:
            answer = sidecar.get("/readyz")
        except httpx.HTTPError:
            answer = None
        if answer is not None and check(answer):
            return answer.text
        time.sleep(0.1)
    shown = None if answer is None else (answer.status_code, answer.text)
    raise AssertionError(f"/readyz never met the condition; last answer {shown}")


def _status(code: int, starts: str) -> Callable[[httpx.Response], bool]:
    return lambda answer: answer.status_code == code and answer.text.startswith(starts)


def test_nothing_listening_is_not_ready(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    sidecar = SidecarProcess(["--vllm-url", url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready()
        body = _ready_until(sidecar, _status(503, "not ready, unreachable"))
        assert body == (
            "not ready, unreachable (not started, or still loading: vLLM listens once its model is loaded): "
            f"vLLM unreachable at {url}/health: connection refused\n"
        )
    finally:
        sidecar.kill()


def test_readiness_follows_what_answers_at_the_url_not_vllm_then_vllm_then_blind_then_gone(tmp_path: Path) -> None:
    server = LoopbackServer()  # no routes: 404 on every path, like a web server that is not vLLM
    sidecar = SidecarProcess(["--vllm-url", server.url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready()
        body = _ready_until(sidecar, _status(503, "not ready, not vLLM"))
        assert f"vLLM {server.url}/health answered HTTP 404" in body
        assert "/readyz" not in server.hits  # it asked vLLM, not itself
        server.routes.update(VLLM)
        assert _ready_until(sidecar, _status(200, "ready")) == "ready: admitting traffic\n"
        # vLLM healthy, its metrics unreadable: a sidecar that cannot watch keeps a healthy server in rotation.
        server.routes["/metrics"] = respond(500, b"boom")
        body = _ready_until(sidecar, _status(200, "ready: admitting traffic; but"))
        assert body == (
            "ready: admitting traffic; but the sidecar cannot read its metrics: "
            f"vLLM {server.url}/metrics answered HTTP 500\n"
        )
        server.close()  # vLLM's process is gone: nothing listens any more
        # A poll under way as the server closed can time out first (CI run 29: "did not answer within 0.4 s"), a
        # reason of its own; the next one meets the closed port.
        refused = f"vLLM unreachable at {server.url}/health: connection refused\n"
        body = _ready_until(
            sidecar, lambda answer: _status(503, "not ready, gone")(answer) and answer.text.endswith(refused)
        )
        assert body.startswith("not ready, gone (was healthy ")
        metrics = sidecar.get("/metrics").text
        assert "vllm_sidecar_ready 0.0" in metrics
        assert "vllm_sidecar_admission_paused 0.0" in metrics  # not the policy's pause: vLLM is not there
        # Read a moment after /readyz: "was healthy N s ago" may have ticked on in between (CI run 24: 2 s, 3 s).
        ago = re.compile(r"was healthy \d+ s ago")
        said = sidecar.get("/status").json()["policy"]["readiness"]
        assert ago.sub("was healthy N s ago", said) == ago.sub("was healthy N s ago", body.rstrip("\n"))
    finally:
        sidecar.kill()
        server.close()


def test_a_dead_engine_behind_a_live_server_is_not_ready_before_the_policy_acts(tmp_path: Path) -> None:
    server = LoopbackServer()
    server.routes.update(VLLM)
    sidecar = SidecarProcess(["--vllm-url", server.url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready()
        _ready_until(sidecar, _status(200, "ready"))
        server.routes["/health"] = respond(503)  # vLLM >= 0.11 on EngineDeadError; /metrics still answers
        body = _ready_until(sidecar, _status(503, "not ready, not healthy"))
        assert body.startswith("not ready, not healthy (was healthy ")
        assert body.endswith(f"vLLM {server.url}/health answered HTTP 503\n")
        # --dead-after (30 s) has not passed: no restart yet, only readiness withdrawn.
        assert sidecar.get("/status").json()["policy"]["state"] != "draining"
    finally:
        sidecar.kill()
        server.close()
