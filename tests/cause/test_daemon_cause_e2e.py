"""The daemon as a real process: vLLM's engine dies (its /health fails), the sidecar restarts it with the exec
adapter, and the restart's notifications reach a real webhook receiver with the cause read from --vllm-log;
/status shows it. (A log that cannot be read: tests/cause/test_crash_cause_step.py, same step, no process.)"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.cause.logs import OOM_CAUSE, STARTED, oom_death
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, respond, until, vllm_stand_in
from tests.notify.receiver import Receiver

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-after-load.prom").read_bytes()


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = vllm_stand_in(CAPTURE)
    yield server
    server.close()


async def _sidecar(vllm: LoopbackServer, tmp_path: Path, receiver: Receiver, log: Path) -> SidecarProcess:
    marker = tmp_path / "restarted"
    restart = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('x')\""
    sidecar = SidecarProcess(
        [
            *("--vllm-url", vllm.url, "--interval", "0.3", "--gpu-source", "none", "--state-dir", str(tmp_path / "s")),
            *("--actuator", "exec", "--exec-command", restart, "--dead-after", "1", "--startup-timeout", "30"),
            *("--webhook-url", receiver.url + "/hook", "--vllm-log", str(log)),
        ],
        tmp_path / "sidecar.log",
    )
    await asyncio.to_thread(sidecar.wait_ready)
    return sidecar


async def _engine_dies_and_is_restarted(vllm: LoopbackServer, sidecar: SidecarProcess, tmp_path: Path) -> None:
    await until(lambda: sidecar.get("/status").json()["policy"]["state"] == "normal", 20, "the policy to settle")
    # The engine died inside a server that still answers: 503s (with /metrics failing too, /health is asked
    # every poll rather than trusted for a few seconds)
    vllm.routes.update({"/health": respond(503), "/metrics": respond(503)})
    await until((tmp_path / "restarted").is_file, 20, "the exec adapter's restart")
    vllm.routes.update({"/health": respond(), "/metrics": respond(body=CAPTURE)})  # what the restart brought back


def _documents(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in receiver.requests]


async def test_the_restart_notifications_and_status_say_why_vllm_died(vllm: LoopbackServer, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(oom_death() + STARTED)  # died, and its supervisor already started it again
    async with Receiver() as receiver:
        sidecar = await _sidecar(vllm, tmp_path, receiver, log)
        try:
            await _engine_dies_and_is_restarted(vllm, sidecar, tmp_path)
            await until(
                lambda: "restart_end" in [d["kind"] for d in _documents(receiver)], 30, "the restart's end notification"
            )
            status = sidecar.get("/status").json()
        finally:
            sidecar.kill()
    by_kind = {document["kind"]: document for document in _documents(receiver)}
    begin, end = by_kind["restart_begin"], by_kind["restart_end"]
    assert begin["reason"] == end["reason"] == "engine_dead"
    for document in (begin, end):
        cause = document["cause"]
        assert cause["cause"] == OOM_CAUSE, cause
        assert [r["flag"] for r in cause["recommendations"]] == ["--gpu-memory-utilization", "PYTORCH_CUDA_ALLOC_CONF"]
        assert cause["source"].startswith(f"file {log}, ")
    assert "pause" not in by_kind or by_kind["pause"]["cause"] is None
    shown = status["policy"]["crash_cause"]
    assert shown["cause"] == OOM_CAUSE
    assert shown["source"] == begin["cause"]["source"]
    assert isinstance(shown["read_timestamp_seconds"], float)
    records = [event for event in sidecar.events() if event["event"] == "notification" and "cause" in event]
    assert {record["kind"] for record in records} == {"restart_begin", "restart_end"}
