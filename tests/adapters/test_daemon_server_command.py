"""The daemon as a real process reads vLLM's flags from its server's command line while vLLM serves, and the
notification of its death uses them where the log's tail no longer states them (issue 25, item 6): a scripted
vLLM on loopback, its server stood in for by a process whose command line is vLLM's for that port
(`--gpu-memory-utilization 0.85`), and a log holding only the serving OOM's traceback."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.adapters.daemon_process import SidecarProcess
from tests.adapters.fake_vllm_tree import FakeVllmTree
from tests.cause.test_server_command import SERVING_OOM
from tests.conftest import EXPOSITIONS
from tests.loopback import respond, until, vllm_stand_in
from tests.notify.receiver import Receiver

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-after-load.prom").read_bytes()


def _documents(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in receiver.requests]


async def test_a_deaths_notification_uses_the_flags_of_the_command_line_seen_while_vllm_served(
    tmp_path: Path,
) -> None:
    vllm = vllm_stand_in(CAPTURE)
    log = tmp_path / "vllm.log"
    log.write_text("INFO serving\n")
    marker = tmp_path / "restarted"
    restart = f"{sys.executable} -c \"open({str(marker)!r}, 'a').write('x')\""
    try:
        with FakeVllmTree(vllm.port) as tree:
            async with Receiver() as receiver:
                sidecar = SidecarProcess(
                    [
                        *("--vllm-url", vllm.url, "--interval", "0.3", "--gpu-source", "none"),
                        *("--state-dir", str(tmp_path / "s"), "--actuator", "exec", "--exec-command", restart),
                        *("--dead-after", "1", "--webhook-url", receiver.url + "/hook", "--vllm-log", str(log)),
                    ],
                    tmp_path / "sidecar.log",
                )
                try:
                    await asyncio.to_thread(sidecar.wait_ready)
                    await until(lambda: sidecar.get("/status").json()["policy"]["state"] == "normal", 20, "normal")
                    with log.open("a") as out:
                        out.write(SERVING_OOM)  # it died of a serving OOM; its arguments line is long gone
                    vllm.routes.update({"/health": respond(503), "/metrics": respond(503)})
                    await until(marker.is_file, 30, "the exec adapter's restart")
                    await until(lambda: "restart_begin" in [d["kind"] for d in _documents(receiver)], 30, "begin")
                finally:
                    sidecar.kill()
    finally:
        vllm.close()
    begin = next(document for document in _documents(receiver) if document["kind"] == "restart_begin")
    cause = begin["cause"]
    assert cause["cause"] == "configuration_overshoot"
    # 0.85 from the server's command line, less the 0.050 the doctor's step says: a value, not a step.
    first = cause["recommendations"][0]
    assert (first["flag"], first["value"]) == ("--gpu-memory-utilization", 0.8)
    assert cause["source"].endswith(f"flags from vLLM's server command line (pid {tree.server_pid})")
