"""Incidents with real processes and the real py-spy: a SIGSTOPped process's stack, a refused read in one line, a
py-spy that hangs killed at the deadline, the time and size limits, retention, and what is kept without
py-spy. py-spy comes with the dev environment (pyproject's `dev` extra); without it these tests skip, except
in CI, where they fail."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.log_source import LogRead, Wanted
from sidecar.actuators.none import NoActuator
from sidecar.model.incident import LOG_FILE, MANIFEST_FILE, IncidentRef, Kind, Trigger
from sidecar.model.server_command import ServerCommand
from sidecar.notify.message import Notification, NotificationKind
from sidecar.parse.vllm_process import ProcessRole, VllmProcess, VllmProcesses
from sidecar.policy.decision import Action, ActionKind, Decision, PolicyState
from sidecar.policy.machine import Policy
from sidecar.policy.settings import PolicySettings
from sidecar.report.incident import MANIFEST_RESERVE_BYTES
from sidecar.shell.acting import Acting
from sidecar.shell.incident import NOT_SEEN, IncidentRecorder, IncidentSettings, MetricsRead, StackDumper
from sidecar.shell.incident_files import Piece, plan
from sidecar.shell.log_with_command import LogWithCommand
from sidecar.shell.state_file import StateFile
from sidecar.sources.stack_dump import NO_PERMISSION, NO_PY_SPY, StackDump, dump_stack, find_py_spy
from sidecar.sources.vllm_command import ServerCommandMemory
from sidecar.sources.vllm_processes import find_vllm_processes
from tests.adapters.fake_vllm_tree import ENGINE_FUNCTION, SECRET_KEY, SERVER_FUNCTION, FakeVllmTree
from tests.conftest import required_in_ci
from tests.loopback import closed_port

SECRET = "sk-not-for-any-file"  # noqa: S105 - a made-up key the capture must not write
WAITING = "def waiting_in_a_named_function():\n    time.sleep(600)\n"


@pytest.fixture
def py_spy() -> Path:
    found = find_py_spy()
    if found is None:
        if required_in_ci():
            pytest.fail("py-spy is required in CI (the dev extra installs it)", pytrace=False)
        pytest.skip("py-spy not installed (pip install py-spy)")
    return found


@pytest.fixture
def stopped_process() -> Iterator[int]:
    """A Python process waiting in a named function, stopped with SIGSTOP; its command line holds a secret."""
    code = f"import time\n{WAITING}print('ready', flush=True)\nwaiting_in_a_named_function()\n"
    argv = [sys.executable, "-c", code, "--api-key", SECRET]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # into the sleep
    os.kill(process.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while state_of(process.pid) != "T":  # a signal is delivered when the process next runs
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.02)
    yield process.pid
    process.kill()
    process.wait(timeout=10)


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


async def test_py_spy_reads_the_stack_of_a_stopped_process(py_spy: Path, stopped_process: int) -> None:
    assert state_of(stopped_process) == "T"
    dump = await dump_stack(py_spy, stopped_process, timeout_s=20)
    assert dump.error is None, dump.error
    assert dump.text is not None
    assert "waiting_in_a_named_function" in dump.text
    assert SECRET not in dump.text, dump.text[:400]  # the header of py-spy's dump is the command line
    assert "--api-key ***" in dump.text.partition("\nPython v")[0]


async def test_a_read_the_kernel_refuses_is_one_line_naming_the_permission(
    py_spy: Path, stopped_process: int, tmp_path: Path
) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run py-spy as another user without capabilities")
    unprivileged = tmp_path / "py-spy"
    unprivileged.write_text(
        f"#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "
        f'--bounding-set=-all {py_spy} "$@"\n'
    )
    unprivileged.chmod(0o755)
    dump = await dump_stack(unprivileged, stopped_process, timeout_s=20)
    assert dump.text is None
    assert dump.error == NO_PERMISSION.format(pid=stopped_process)


async def test_a_py_spy_that_hangs_is_killed_at_the_deadline(tmp_path: Path) -> None:
    hanging = tmp_path / "py-spy"
    hanging.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 600\n")
    hanging.chmod(0o755)
    started = time.monotonic()
    dump = await dump_stack(hanging, 1, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert dump.error == "py-spy did not finish within 0.5 s; killed"
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the group was killed and reaped


def recorder(
    tmp_path: Path,
    *,
    py_spy: Path | None,
    processes: VllmProcesses | None = None,
    port: int = 8000,
    keep: int = 10,
    timeout_s: float = 10.0,
    max_bytes: int = 2**20,
    log: object = None,
    dump: StackDumper = dump_stack,
) -> IncidentRecorder:
    log_file = tmp_path / "vllm.log"
    if not log_file.exists():
        log_file.write_text("INFO vLLM started\nERROR the engine stopped answering\n")
    return IncidentRecorder(
        IncidentSettings(
            state_dir=tmp_path / "state", keep=keep, timeout_s=timeout_s, max_bytes=max_bytes, vllm_url="http://x"
        ),
        logger=structlog.get_logger(),
        log_source=log if log is not None else FileLog(log_file),  # type: ignore[arg-type]  # a test's twin
        py_spy=py_spy,
        find_processes=(lambda: processes) if processes is not None else (lambda: find_vllm_processes(port)),
        last_metrics=lambda: MetricsRead(text="vllm:num_requests_running 3\n", wall_time_s=time.time() - 2),
        status_history=lambda: [{"sidecar": {"version": "test"}, "n": n} for n in range(3)],
        dump=dump,
    )


async def capture(
    incidents: IncidentRecorder, cause: str = "engine_hung", trigger: Trigger = Trigger.BEFORE_RESTART
) -> tuple[IncidentRef | None, Path]:
    ref = incidents.reserve(cause, time.time())
    written = await incidents.capture(ref, trigger=trigger, state="restarting", reason="hung", wanted=Wanted.LAST)
    return written, Path(ref.path)


def manifest(folder: Path) -> dict[str, object]:
    document: dict[str, object] = json.loads((folder / MANIFEST_FILE).read_text())
    return document


async def test_the_incident_holds_the_stopped_engine_cores_stack(py_spy: Path, tmp_path: Path) -> None:
    port = closed_port()
    with FakeVllmTree(port) as tree:
        tree.stop_engine()
        written, folder = await capture(recorder(tmp_path, py_spy=py_spy, port=port))
    assert written is not None
    document = manifest(folder)
    stacks = [item for item in document["captured"] if item["kind"] == "stacks"]  # type: ignore[attr-defined]
    assert [(item["pid"], item["role"]) for item in stacks] == [
        (tree.engine_pid, "engine_core"),
        (tree.server_pid, "api_server"),
    ]
    engine = (folder / f"stacks-engine_core-{tree.engine_pid}.txt").read_text()
    assert ENGINE_FUNCTION in engine
    assert "state T" in engine.splitlines()[0]
    assert SERVER_FUNCTION in (folder / f"stacks-api_server-{tree.server_pid}.txt").read_text()
    assert document["not_captured"] == []
    assert {item["kind"] for item in document["captured"]} == {"stacks", "log", "metrics", "status_history"}  # type: ignore[attr-defined]
    # The API server's command line, for the doctor (the flags a log's tail lacks), with its key redacted.
    assert str(document["vllm_command"]).endswith(f"--port {port} --gpu-memory-utilization 0.85 --api-key ***")
    assert SECRET_KEY not in (folder / MANIFEST_FILE).read_text()
    assert not any(SECRET_KEY in path.read_text() for path in folder.glob("stacks-*.txt"))
    assert (folder / LOG_FILE).read_text().endswith("ERROR the engine stopped answering\n")
    assert os.stat(folder).st_mode & 0o777 == 0o700


async def test_without_py_spy_or_vllms_processes_one_line_says_why_and_the_rest_is_kept(tmp_path: Path) -> None:
    written, folder = await capture(recorder(tmp_path, py_spy=None))
    assert written is not None
    assert manifest(folder)["not_captured"] == [{"kind": "stacks", "pid": None, "role": None, "why": NO_PY_SPY}]
    assert {item["kind"] for item in manifest(folder)["captured"]} == {"log", "metrics", "status_history"}  # type: ignore[attr-defined]
    nothing = VllmProcesses(processes=(), note=None)
    written, folder = await capture(recorder(tmp_path, py_spy=Path("/bin/true"), processes=nothing))
    assert manifest(folder)["not_captured"] == [{"kind": "stacks", "pid": None, "role": None, "why": NOT_SEEN}]
    written, folder = await capture(recorder(tmp_path, py_spy=None), "vllm_died", Trigger.AFTER_CRASH)
    assert manifest(folder)["trigger"] == "after_crash"
    assert "gone" in manifest(folder)["not_captured"][0]["why"]  # type: ignore[index]


class HangingLog:
    where = "a log that never answers"

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_the_capture_never_takes_longer_than_its_limit(tmp_path: Path) -> None:
    async def hanging_dump(py_spy: Path, pid: int, *, timeout_s: float) -> StackDump:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    engine = VllmProcess(
        pid=7, role=ProcessRole.ENGINE_CORE, title="VLLM::EngineCore", command="VLLM::EngineCore", state="T"
    )
    processes = VllmProcesses(processes=(engine,), note=None)
    incidents = recorder(
        tmp_path, py_spy=Path("/bin/true"), processes=processes, timeout_s=1.0, log=HangingLog(), dump=hanging_dump
    )
    started = time.monotonic()
    written, folder = await capture(incidents)
    assert time.monotonic() - started < 1.0 + 1.0  # the limit, and a loop's slack on a busy machine
    assert written is not None
    missing = {item["kind"]: item["why"] for item in manifest(folder)["not_captured"]}  # type: ignore[attr-defined]
    assert missing == {"stacks": "not in within the incident's 0.8 s", "log": "not in within the incident's 0.8 s"}


async def test_only_the_newest_incidents_are_kept(tmp_path: Path) -> None:
    incidents = recorder(tmp_path, py_spy=None, keep=2)
    folders = [(await capture(incidents, cause))[1] for cause in ("engine_dead", "oom_forecast", "manual")]
    assert sorted(path.name for path in (tmp_path / "state" / "incidents").iterdir()) == sorted(
        folder.name for folder in folders[1:]
    )
    assert incidents.last is not None
    assert incidents.last.path == str(folders[-1])


def test_over_the_size_limit_the_stacks_come_first_and_a_log_keeps_its_newest_lines() -> None:
    log = b"".join(f"line {n}\n".encode() for n in range(1000))
    pieces = [
        Piece.found(Kind.STACKS, b"Thread 1\n  f (x.py:1)\n" * 10, pid=7, role="engine_core"),
        Piece.found(Kind.LOG, log, tail=True),
        Piece.found(Kind.METRICS, b"vllm:x 1\n" * 100),
        Piece.listed(Kind.STATUS_HISTORY, ['{"n": 1}', '{"n": 2}'], note="two"),
    ]
    planned = plan(pieces, MANIFEST_RESERVE_BYTES + 1000)
    files = dict(planned.files)
    assert files["stacks-engine_core-7.txt"] == pieces[0].data
    assert len(files["vllm.log"]) <= 1000 - 220
    assert files["vllm.log"].endswith(b"line 999\n")
    assert files["vllm.log"].startswith(b"line ")
    assert [item["truncated"] for item in planned.captured] == [False, True]
    assert [(item["kind"], item["why"].split(" (")[0]) for item in planned.not_captured] == [
        ("metrics", "larger than the 0 bytes left of the incident's limit"),
        ("status_history", "larger than the 0 bytes left of the incident's limit"),
    ]
    roomy = plan(pieces[3:], MANIFEST_RESERVE_BYTES + 14)
    assert dict(roomy.files)["status-history.json"] == b'[\n{"n": 2}\n]\n'  # the newest that fits


async def test_a_crash_the_sidecar_did_not_restart_is_an_incident_its_notification_names(tmp_path: Path) -> None:
    """vLLM died and came back on its own: the vllm_recovered notification names the folder at once, which is
    then written off the tick, with the log and history and no stacks (the processes that died are gone)."""
    notes: list[Notification] = []
    incidents = recorder(tmp_path, py_spy=None)
    acting = Acting(
        policy=Policy(PolicySettings()),
        actuator=NoActuator(),
        ledger_file=StateFile(tmp_path / "ledger.json"),
        notify=notes.append,
        logger=structlog.get_logger(),
        dry_run=False,
        incidents=incidents,
    )
    back = Action(kind=ActionKind.NOTIFY_VLLM_RECOVERED, reason="vLLM is healthy again: its /health failed for 30 s")
    acting._apply(
        Decision(
            state=PolicyState.NORMAL,
            previous_state=PolicyState.DOWN,
            admission_paused=False,
            pause_reason=None,
            actions=(back,),
            reason=back.reason,
            would_restart_but=None,
            blocked_by=None,
            restart_reason=None,
            cooldown_remaining_s=None,
            restarts_in_budget_window=0,
            manual_pause=False,
            now_s=100.0,
            wall_time_s=time.time(),
        )
    )
    (note,) = notes
    assert note.kind is NotificationKind.VLLM_RECOVERED
    assert note.incident is not None
    assert "-vllm_died" in note.incident
    folder = Path(note.incident)
    deadline = time.monotonic() + 20
    while not (folder / MANIFEST_FILE).exists():
        assert time.monotonic() < deadline, "the incident was not written"
        await asyncio.sleep(0.05)
    document = manifest(folder)
    assert (document["cause"], document["trigger"]) == ("vllm_died", "after_crash")
    assert document["decision"]["reason"] == back.reason  # type: ignore[index]
    await acting.close()
    shown = acting.view().last_incident
    assert shown is not None
    assert shown.path == note.incident


async def test_after_a_crash_the_incident_keeps_the_command_line_seen_while_vllm_served(tmp_path: Path) -> None:
    """vLLM's processes are gone after a crash; the server command line the sidecar read while vLLM served (what
    every read of the log carries) is kept instead, for `doctor --incident`."""
    memory = ServerCommandMemory(8000)
    memory.seen = ServerCommand(where="pid 77", command="vllm serve m --max-num-seqs 64", seen_wall_s=time.time() - 600)
    log = LogWithCommand(FileLog(tmp_path / "vllm.log"), memory)
    written, folder = await capture(recorder(tmp_path, py_spy=None, log=log), "vllm_died", Trigger.AFTER_CRASH)
    assert written is not None
    assert manifest(folder)["vllm_command"] == "vllm serve m --max-num-seqs 64"
    memory.seen = None
    written, folder = await capture(recorder(tmp_path, py_spy=None, log=log), "vllm_died", Trigger.AFTER_CRASH)
    assert manifest(folder)["vllm_command"] is None
