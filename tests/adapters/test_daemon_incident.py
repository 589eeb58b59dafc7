"""The daemon as a real process takes an incident before it restarts vLLM: vLLM's engine dies inside a server
that still answers (a scripted vLLM on loopback, its processes stood in for by a process tree whose engine core
is SIGSTOPped), the sidecar writes the incident folder, bounded, then restarts through the exec adapter; the
restart's end notification and /status name the folder, and only the newest --incidents-keep are left."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.doctor_cli.incident_reading import read_incident
from sidecar.model.incident import MANIFEST_FILE
from sidecar.sources.stack_dump import find_py_spy
from tests.adapters.daemon_process import SidecarProcess
from tests.adapters.fake_vllm_tree import ENGINE_FUNCTION, FakeVllmTree
from tests.cause.logs import STARTED, oom_death
from tests.conftest import EXPOSITIONS, required_in_ci
from tests.loopback import LoopbackServer, respond, until, vllm_stand_in
from tests.notify.receiver import Receiver

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-after-load.prom").read_bytes()
MAX_BYTES = 64 * 1024  # the smallest limit, so the log and the metrics are cut to fit
OLD = "20200101T000000Z-manual"


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = vllm_stand_in(CAPTURE)
    yield server
    server.close()


def _documents(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in receiver.requests]


async def test_an_incident_is_kept_before_the_restart_and_named_after_it(vllm: LoopbackServer, tmp_path: Path) -> None:
    if find_py_spy() is None:
        if required_in_ci():
            pytest.fail("py-spy is required in CI (the dev extra installs it)", pytrace=False)
        pytest.skip("py-spy not installed")
    state = tmp_path / "s"
    (state / "incidents" / OLD).mkdir(parents=True)  # an older incident: only the newest is kept
    log = tmp_path / "vllm.log"
    log.write_text(oom_death() * 40 + STARTED)  # more than the folder may hold
    marker = tmp_path / "restarted"
    restart = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('x')\""
    with FakeVllmTree(vllm.port) as tree:
        tree.stop_engine()
        async with Receiver() as receiver:
            sidecar = SidecarProcess(
                [
                    *("--vllm-url", vllm.url, "--interval", "0.3", "--gpu-source", "none", "--state-dir", str(state)),
                    *("--actuator", "exec", "--exec-command", restart, "--dead-after", "1"),
                    *("--webhook-url", receiver.url + "/hook", "--vllm-log", str(log), "--incidents-keep", "1"),
                    *("--incident-max-bytes", str(MAX_BYTES), "--incident-timeout", "10"),
                ],
                tmp_path / "sidecar.log",
            )
            try:
                await asyncio.to_thread(sidecar.wait_ready)
                await until(lambda: sidecar.get("/status").json()["policy"]["state"] == "normal", 20, "normal")
                vllm.routes.update({"/health": respond(503), "/metrics": respond(503)})  # the engine died
                await until(marker.is_file, 30, "the exec adapter's restart")
                vllm.routes.update({"/health": respond(), "/metrics": respond(body=CAPTURE)})
                await until(lambda: "restart_end" in [d["kind"] for d in _documents(receiver)], 30, "the restart's end")
                status = sidecar.get("/status").json()
            finally:
                sidecar.kill()
    folders = list((state / "incidents").iterdir())
    assert len(folders) == 1, folders  # the older one was removed
    folder = folders[0]
    assert folder.name.endswith("-engine_dead")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["cause"] == "engine_dead"
    assert manifest["trigger"] == "before_restart"
    assert "restarting vLLM (engine_dead)" in manifest["decision"]["reason"]
    assert manifest["capture_seconds"] < 10
    captured = {(item["kind"], item["role"]): item for item in manifest["captured"]}
    assert set(captured) >= {("stacks", "engine_core"), ("stacks", "api_server"), ("log", None)}
    engine = folder / captured["stacks", "engine_core"]["file"]
    assert ENGINE_FUNCTION in engine.read_text()
    assert captured["log", None]["truncated"] is True
    assert (folder / "vllm.log").read_text().endswith(STARTED)  # the newest lines kept
    assert sum(path.stat().st_size for path in folder.iterdir()) <= MAX_BYTES
    # The capture came before the restart, and the restart's end names the folder.
    events = [event["event"] for event in sidecar.events()]
    assert events.index("incident") < events.index("restart_outcome")
    end = next(document for document in _documents(receiver) if document["kind"] == "restart_end")
    assert end["incident"] == str(folder)
    assert status["policy"]["last_incident"]["path"] == str(folder)
    assert status["policy"]["last_incident"]["cause"] == "engine_dead"
    # What `doctor --incident` reads of it: where the stopped engine core waited.
    lines = read_incident(folder).lines
    assert any(f"engine_core {tree.engine_pid} " in line and ENGINE_FUNCTION in line for line in lines), lines
