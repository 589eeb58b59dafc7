"""The pure half of incidents: folder names, retention, the size shares, the manifest, and which processes are
vLLM's (sidecar.report.incident, sidecar.parse.vllm_process)."""

from __future__ import annotations

import pytest

from sidecar.model.incident import IncidentRef, Trigger
from sidecar.parse.vllm_process import ProcessEntry, ProcessRole, redacted, redacted_dump, role_of, vllm_processes
from sidecar.report.incident import (
    MANIFEST_RESERVE_BYTES,
    expired,
    incident_name,
    is_incident_name,
    keep_head,
    keep_tail,
    manifest_document,
    shares,
    summary_line,
)

WALL_S = 1_700_000_000.5  # 2023-11-14T22:13:20.5Z


def test_a_name_is_the_utc_second_and_the_cause_and_sorts_by_time() -> None:
    assert incident_name(WALL_S, "engine_hung", ()) == "20231114T221320Z-engine_hung"
    assert incident_name(WALL_S, "engine_hung", {"20231114T221320Z-engine_hung"}) == "20231114T221320Z-engine_hung-2"
    taken = {"20231114T221320Z-engine_hung", "20231114T221320Z-engine_hung-2"}
    assert incident_name(WALL_S, "engine_hung", taken) == "20231114T221320Z-engine_hung-3"
    assert incident_name(WALL_S, "../Odd Cause!", ()) == "20231114T221320Z-odd_cause"
    assert incident_name(WALL_S, "///", ()) == "20231114T221320Z-unknown"
    earlier, later = incident_name(WALL_S - 3600, "oom_forecast", ()), incident_name(WALL_S, "engine_dead", ())
    assert sorted([later, earlier]) == [earlier, later]


def test_retention_drops_the_oldest_incidents_and_nothing_else() -> None:
    names = [
        "20231114T221320Z-engine_hung",
        "20231114T221320Z-engine_hung-2",
        "20231113T000000Z-oom_forecast",
        "20231115T000000Z-vllm_died",
        ".partial-20231116T000000Z-manual",
        "notes.txt",
    ]
    assert expired(names, 2) == ["20231113T000000Z-oom_forecast", "20231114T221320Z-engine_hung"]
    assert expired(names, 10) == []
    assert not is_incident_name("notes.txt")
    assert not is_incident_name(".partial-20231116T000000Z-manual")


def test_the_size_limit_is_shared_in_order_of_worth() -> None:
    limit = MANIFEST_RESERVE_BYTES + 100
    assert shares([30, 50, 40, 10], limit) == [30, 50, 20, 0]
    assert shares([30], MANIFEST_RESERVE_BYTES - 1) == [0]


def test_a_cut_keeps_whole_lines_a_log_its_newest() -> None:
    data = b"one\ntwo\nthree\n"
    assert keep_head(data, 100) == data
    assert keep_head(data, 9) == b"one\ntwo\n"
    assert keep_tail(data, 9) == b"three\n"
    assert keep_tail(data, 0) == b""
    assert keep_head(b"no newline at all", 5) == b"no ne"


def test_the_manifest_says_what_was_captured_and_what_was_not() -> None:
    manifest = manifest_document(
        incident=IncidentRef(path="/s/incidents/20231114T221320Z-engine_hung", cause="engine_hung", wall_time_s=WALL_S),
        trigger=Trigger.BEFORE_RESTART,
        state="restarting",
        reason="no progress for 50 s (hung)",
        vllm_url="http://127.0.0.1:8000",
        captured=[
            {
                "kind": "stacks",
                "file": "stacks-engine_core-7.txt",
                "bytes": 300,
                "truncated": False,
                "pid": 7,
                "role": "engine_core",
                "note": None,
            },
            {
                "kind": "log",
                "file": "vllm.log",
                "bytes": 10,
                "truncated": True,
                "pid": None,
                "role": None,
                "note": None,
            },
        ],
        not_captured=[{"kind": "stacks", "pid": 6, "role": "api_server", "why": "no permission"}],
        capture_s=0.12345,
        timeout_s=5.0,
        max_bytes=2**20,
    )
    assert manifest["time"] == "2023-11-14T22:13:20.500Z"
    assert manifest["trigger"] == "before_restart"
    assert manifest["decision"] == {"state": "restarting", "reason": "no progress for 50 s (hung)"}
    assert manifest["capture_seconds"] == 0.123
    assert manifest["limits"] == {"timeout_seconds": 5.0, "max_bytes": 2**20}
    assert summary_line(manifest) == (
        "incident engine_hung at 2023-11-14T22:13:20.500Z: stacks of 1 process, log; not captured: stacks: "
        "no permission"
    )


def entry(pid: int, ppid: int, command: str, state: str = "S") -> ProcessEntry:
    return ProcessEntry(pid=pid, ppid=ppid, command=command, state=state)


SERVER = "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m --port 8000"
TABLE = [
    entry(1, 0, "/sbin/init"),
    entry(10, 1, SERVER),
    entry(11, 10, "VLLM::EngineCore_DP0", state="T"),
    entry(12, 11, "VLLM::Worker_TP0"),
    entry(13, 10, "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(5)"),
    entry(14, 10, "VLLM::EngineCore_DP1", state="Z"),
    entry(20, 1, "vllm serve other --port 9000"),
    entry(21, 20, "VLLM::EngineCore"),
    entry(30, 1, "vllm-sidecar run --vllm-url http://127.0.0.1:8000"),
]


def test_vllms_processes_are_its_server_for_the_port_and_the_titled_ones_below_it() -> None:
    found = vllm_processes(TABLE, port=8000, own_pid=30)
    assert [(process.pid, process.role) for process in found.processes] == [
        (11, ProcessRole.ENGINE_CORE),
        (12, ProcessRole.WORKER),
        (10, ProcessRole.API_SERVER),
    ]
    assert found.processes[0].state == "T"
    assert found.note is None


def test_without_a_server_for_the_port_every_titled_process_is_taken_and_said() -> None:
    table = [entry(11, 1, "VLLM::EngineCore"), entry(12, 11, "VLLM::Worker_TP0"), entry(5, 1, "bash")]
    found = vllm_processes(table, port=8000, own_pid=99)
    assert [process.pid for process in found.processes] == [11, 12]
    assert found.note == "no vLLM server for port 8000 seen; took every process titled VLLM::*"
    assert vllm_processes([entry(5, 1, "bash")], port=8000, own_pid=99).processes == ()


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("VLLM::EngineCore", ProcessRole.ENGINE_CORE),
        ("VLLM::Worker_TP1_PP0", ProcessRole.WORKER),
        ("VLLM::APIServer_0", ProcessRole.API_SERVER),
        ("VLLM::DPCoordinator", ProcessRole.COORDINATOR),
        ("VLLM::Something", ProcessRole.OTHER),
        ("vllm serve m", ProcessRole.API_SERVER),
        ("python train.py", None),
    ],
)
def test_a_role_from_vllms_titles(command: str, role: ProcessRole | None) -> None:
    assert role_of(command) is role


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("vllm serve m --api-key sk-1 --port 8000", "vllm serve m --api-key *** --port 8000"),
        ("vllm serve m --api-key=sk-1 --max-num-seqs 8", "vllm serve m --api-key=*** --max-num-seqs 8"),
        ("vllm serve m --api-key k1 k2 --enforce-eager", "vllm serve m --api-key *** *** --enforce-eager"),
        ("vllm serve m --hf-token hf_abc", "vllm serve m --hf-token ***"),
        (
            "vllm serve m --s3-secret-access-key abc --s3-access-key-id id",
            "vllm serve m --s3-secret-access-key *** --s3-access-key-id ***",
        ),
        # Flags that only look like secrets keep their values.
        (
            "vllm serve m --max-num-batched-tokens 8192 --tokenizer t --dbo-decode-token-threshold 32 --ssl-keyfile k",
            "vllm serve m --max-num-batched-tokens 8192 --tokenizer t --dbo-decode-token-threshold 32 --ssl-keyfile k",
        ),
    ],
)
def test_a_command_line_never_shows_a_secret_flags_value(command: str, shown: str) -> None:
    assert redacted(command) == shown
    found = vllm_processes([entry(10, 1, command)], port=8000, own_pid=99)
    assert found.processes[0].title == shown[:159] + ("…" if len(shown) > 160 else "")


def test_py_spys_header_line_never_shows_a_secret_flags_value() -> None:
    dump = "Process 41: python -m vllm.entrypoints.openai.api_server --api-key sk-1\nPython v3.12.3\n\nThread 41\n"
    assert (
        redacted_dump(dump).splitlines()[0] == "Process 41: python -m vllm.entrypoints.openai.api_server --api-key ***"
    )
    assert redacted_dump(dump).splitlines()[1:] == dump.splitlines()[1:]
