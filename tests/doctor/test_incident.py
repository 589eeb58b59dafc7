"""`vllm-sidecar doctor --incident DIR`: the folder the daemon kept is the evidence (its log, its metrics, the
newest of its /status documents), with no live read; a folder that is not an incident is exit 2, one line.

The folder is written by the daemon's own recorder (sidecar.shell.incident) from inputs whose answers are known:
the log is a CUDA OOM death with another tenant on the GPU (configuration_overshoot, tests/cause/logs.py), the
newest /status document is the hang run's after its restart (engine_hang, tests/doctor/status/README.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import structlog

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.log_source import Wanted
from sidecar.cli import main
from sidecar.doctor_cli.incident_reading import top_frames
from sidecar.model.incident import MANIFEST_FILE, Trigger
from sidecar.parse.vllm_process import ProcessRole, VllmProcess, VllmProcesses
from sidecar.shell.incident import IncidentRecorder, IncidentSettings, MetricsRead
from sidecar.sources.stack_dump import NO_PY_SPY
from tests.cause.logs import OOM_CAUSE, oom_death
from tests.conftest import EXPOSITIONS
from tests.loopback import closed_port

STATUS = Path(__file__).parent / "status"


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


NO_PROCESSES = VllmProcesses(processes=(), note=None)


def _incident(
    tmp_path: Path, log_text: str | None = None, processes: VllmProcesses = NO_PROCESSES, *, metrics: bool = True
) -> Path:
    log = tmp_path / "vllm.log"
    log.write_text(oom_death() if log_text is None else log_text)
    history = [json.loads((STATUS / name).read_text()) for name in ("hang-pressure-4s.json", "hang-restarted.json")]
    exposition = (EXPOSITIONS / "vllm-0.32.0-cpu-after-load.prom").read_text()
    recorder = IncidentRecorder(
        IncidentSettings(state_dir=tmp_path / "state", keep=5, timeout_s=10, max_bytes=2**20, vllm_url="http://x"),
        logger=structlog.get_logger(),
        log_source=FileLog(log),
        py_spy=None,
        find_processes=lambda: processes,
        last_metrics=lambda: MetricsRead(text=exposition, wall_time_s=time.time()) if metrics else None,
        status_history=lambda: history,
    )
    incident = recorder.reserve("engine_dead", time.time())
    written = asyncio.run(
        recorder.capture(
            incident, trigger=Trigger.BEFORE_RESTART, state="restarting", reason="died", wanted=Wanted.DIED
        )
    )
    assert written is not None
    return Path(incident.path)


def test_the_doctor_diagnoses_from_the_incident_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _incident(tmp_path)
    capsys.readouterr()  # the recorder's log line
    nothing_there = f"http://127.0.0.1:{closed_port()}"  # never asked: the incident is the evidence
    code = main(["doctor", "--incident", str(folder), "--vllm-url", nothing_there, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    causes = [finding["cause"] for finding in document["findings"]]
    assert OOM_CAUSE in causes
    assert "engine_hang" in causes
    code = main(["doctor", "--incident", str(folder), "--gpu-source", "none"])
    text = capsys.readouterr().out
    assert f"incident {folder}: engine_dead at " in text
    assert f"stacks not captured: {NO_PY_SPY}" in text
    assert f"at incident {folder}: read /metrics" in text
    assert "(the newest of 2 /status documents)" in text


def test_the_command_line_the_incident_kept_gives_the_flags_its_log_does_not_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long-running server's log tail has no arguments line; the API server's command line, seen when the
    incident was taken, gives its budget: a value where the log alone gives a step."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.69 GiB of which 979.69 MiB is free. Including non-PyTorch memory, this process has 22.73 GiB memory in "
        "use. Of the allocated memory 22.29 GiB is allocated by PyTorch, and 129.54 MiB is reserved by PyTorch but "
        "unallocated.\n"
    )
    command = "python3 -m vllm.entrypoints.openai.api_server --model m --gpu-memory-utilization 0.85 --api-key ***"
    server = VllmProcess(pid=41, role=ProcessRole.API_SERVER, title=command, command=command, state="S")
    # No /metrics kept: vLLM's own cache_config_info would state the budget and win.
    folder = _incident(tmp_path, oom, VllmProcesses(processes=(server,), note=None), metrics=False)
    assert json.loads((folder / MANIFEST_FILE).read_text())["vllm_command"] == command
    capsys.readouterr()
    nothing_there = f"http://127.0.0.1:{closed_port()}"
    main(["doctor", "--incident", str(folder), "--vllm-url", nothing_there, "--json"])
    document = json.loads(capsys.readouterr().out)
    budget = [r for r in document["findings"][0]["recommendations"] if r["flag"] == "--gpu-memory-utilization"]
    assert [r["value"] for r in budget] == [0.79]  # 0.85 - 1.04 GiB / 23.69 GiB - 1 %
    assert "flags: the vLLM command line the incident kept (gpu_memory_utilization 0.85)" in document["notes"]
    main(
        [
            "doctor",
            "--incident",
            str(folder),
            "--vllm-url",
            nothing_there,
            "--json",
            "--vllm-command",
            "--gpu-memory-utilization 0.8",
        ]
    )
    given = json.loads(capsys.readouterr().out)
    assert "flags: --vllm-command (gpu_memory_utilization 0.8)" in given["notes"]  # the user's word wins


def test_a_folder_that_is_no_incident_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["doctor", "--incident", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"vllm-sidecar: error: cannot read --incident {tmp_path}: {tmp_path / MANIFEST_FILE}: ")
    (tmp_path / MANIFEST_FILE).write_text('{"version": 1}')
    code = main(["doctor", "--incident", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "is not an incident manifest: time: field required" in err.lower()


DUMP = """Process 1022: VLLM::EngineCore
Python v3.12.3 (/usr/bin/python3.12)

Thread 1022 (idle): "MainThread"
    wait (threading.py:355)
    get (queue.py:171)
    run_busy_loop (vllm/v1/engine/core.py:882)
Thread 1077 (idle): "Thread-1 (process_input_sockets)"
    poll (zmq/sugar/socket.py:1060)
    process_input_sockets (vllm/v1/engine/core.py:1011)
Thread 1078 (active)
    execute_model (vllm/v1/worker/cpu_model_runner.py:91)
"""


def test_the_notes_say_where_each_thread_of_a_stack_waited() -> None:
    assert top_frames(DUMP) == [
        "wait (threading.py:355) under run_busy_loop (vllm/v1/engine/core.py:882) [MainThread]",
        "poll (zmq/sugar/socket.py:1060) [Thread-1 (process_input_sockets)]",
        "execute_model (vllm/v1/worker/cpu_model_runner.py:91) [Thread 1078 (active)]",
    ]
    assert top_frames("Process 1: x\n") == []
