"""The daemon's history as findings: /status documents the daemon served while watching the simulator (a hang,
an idle wedge, KV pressure, a leak, a burst; see tests/doctor/status/README.md) read by the doctor's rules."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.history import HistoryError
from sidecar.doctor.versions import FLAGS, available, graph_sizes_flag, parse_version
from sidecar.doctor_cli.history_reading import status_history
from tests.doctor.builders import cache_config, engine, evidence, live, reading

STATUS = Path(__file__).parent / "status"
DOCTOR = Path(__file__).parents[2] / "sidecar" / "doctor"


def _document(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((STATUS / name).read_text())
    return document


def _findings(document: dict[str, Any], **live_kwargs: Any) -> list[Finding]:
    ev = evidence(live_evidence=live(error="unreachable", **live_kwargs), history_facts=status_history(document, "s"))
    result = diagnose(ev)
    assert result.diagnosable, "a /status document alone is enough to diagnose from"
    return list(result.findings)


def _one(findings: list[Finding], cause: Cause) -> Finding:
    (found,) = [f for f in findings if f.cause is cause]
    return found


def _flags(finding: Finding) -> dict[str, object]:
    return {r.flag: r.value for r in finding.recommendations}


def test_a_hang_the_daemon_paused_probed_and_restarted_for_is_an_engine_hang_with_its_timeline() -> None:
    document = _document("hang-restarted.json")
    findings = _findings(document, version=None)
    assert [f.cause for f in findings] == [Cause.ENGINE_HANG]
    hang = findings[0]
    assert hang.severity is Severity.CRITICAL
    stalled = document["engines"][0]["engine_stalled_seconds"]
    polled = document["sidecar"]["last_poll_timestamp_seconds"]
    assert any("no progress since " in line and f"{stalled:,.0f} s before the daemon's last poll" in line
               for line in hang.evidence)  # fmt: skip
    assert any("16 requests running" in line for line in hang.evidence)
    restart = next(e for e in document["policy"]["recent"] if "restart" in e["actions"])
    assert any(line.endswith(restart["reason"]) and "drain, restart" in line for line in hang.evidence)
    assert "the sidecar restarted vLLM 1 time for a hang (restarts engine_hung)" in hang.evidence
    assert any(line.startswith("the daemon's 1-token probe completions: no_answer") for line in hang.evidence)
    assert any("cannot show" in line for line in hang.evidence), "/health stayed 200"
    assert polled - stalled < restart["wall_time_s"], "the fixture's stall began before the restart"
    assert not any("stopped again after the last restart" in line for line in hang.evidence)
    # vLLM 0.32.0 from the document: V1, the EngineCore, the multiprocessing executor's timeout.
    assert _flags(hang) == {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": 120}
    assert any("py-spy dump --pid" in step and "VLLM::EngineCore" in step for step in hang.steps)
    assert any("--hung-after" in step for step in hang.steps)


def test_on_a_v0_vllm_the_hang_names_the_iteration_timeout_and_the_api_server_process() -> None:
    document = copy.deepcopy(_document("hang-restarted.json"))
    document["vllm"]["version"] = "0.7.3"
    hang = _one(_findings(document, version=None), Cause.ENGINE_HANG)
    assert _flags(hang) == {"VLLM_ENGINE_ITERATION_TIMEOUT_S": 60}
    assert any("the vLLM API server process" in step for step in hang.steps)
    document["vllm"]["version"] = None
    assert _flags(_one(_findings(document, version=None), Cause.ENGINE_HANG)) == {}, "version unknown: no env var"


def test_an_engine_wedged_while_idle_is_a_hang_from_seconds_since_progress_and_the_probe() -> None:
    document = _document("hang-idle-wedge.json")
    assert document["engines"][0]["engine_stalled_seconds"] == 0.0, "idle: the stall clock does not run"
    hang = _one(_findings(document, version=None), Cause.ENGINE_HANG)
    quiet = document["engines"][0]["seconds_since_progress"]
    assert any("no progress at all since" in line and f"{quiet:,.0f} s before" in line for line in hang.evidence)
    assert any("probe completion got no answer" in line for line in hang.evidence)


def test_a_short_stall_the_policy_only_watches_is_no_finding() -> None:
    document = _document("hang-pressure-4s.json")
    assert document["policy"]["state"] == "pressure"
    assert "made no progress" in document["policy"]["reason"]
    assert _findings(document, version=None) == []


def test_pauses_for_kv_pressure_are_a_concurrency_misjudgement_with_the_headroom_arithmetic() -> None:
    document = _document("kv-pressure.json")
    finding = _one(_findings(document, version=None), Cause.CONCURRENCY_MISJUDGEMENT)
    engine_doc = document["engines"][0]
    capacity, per_request = engine_doc["kv_cache_capacity_blocks"], engine_doc["kv_cache_blocks_per_request"]
    limit = max(float(m.group(1)) for e in document["policy"]["recent"]
                if (m := re.search(r">= ([\d.]+) on engine", e["reason"])))  # fmt: skip
    seqs = math.floor(capacity * limit / per_request)
    assert _flags(finding) == {"--max-num-seqs": seqs, "--max-num-queued-reqs": 2 * seqs}
    pauses = sum("pause_admission" in e["actions"] for e in document["policy"]["recent"])
    assert finding.evidence[0].startswith(f"the sidecar paused admission {pauses} time{'s' if pauses != 1 else ''} ")
    assert f"the KV cache holds {capacity:,} / {per_request:,.1f} = {capacity / per_request:,.1f} requests" in " ".join(
        finding.evidence
    )
    # The simulator's requests are 1,000 + 128 tokens in 16-token blocks: 70.5 blocks when finished. The value
    # sized from mid-generation blocks lies between that and what the running requests already hold.
    assert math.floor(capacity * limit / 70.5) <= seqs <= engine_doc["requests_running"]


def test_on_a_vllm_before_029_no_queued_requests_cap_is_recommended() -> None:
    document = copy.deepcopy(_document("kv-pressure.json"))
    document["vllm"]["version"] = "0.28.0"
    finding = _one(_findings(document, version=None), Cause.CONCURRENCY_MISJUDGEMENT)
    assert list(_flags(finding)) == ["--max-num-seqs"]


def test_a_live_concurrency_finding_absorbs_the_daemons_pauses() -> None:
    preempting = engine(cache_config=cache_config(kv_cache_size_tokens=40960), preemptions_total=12.0)
    history = status_history(_document("kv-pressure.json"), "s")
    from tests.doctor.builders import traffic

    load = traffic([1000.0] * 60, [128.0] * 60)
    ev = evidence(live_evidence=live(vllm=reading(preempting), load=load), history_facts=history)
    (finding,) = [f for f in diagnose(ev).findings if f.cause is Cause.CONCURRENCY_MISJUDGEMENT]
    assert any("the sidecar paused admission" in line for line in finding.evidence)
    assert finding.evidence[0].startswith("KV pool 40,960 tokens"), "the live finding leads"


def test_a_burst_that_ran_out_of_free_memory_without_a_trend_is_no_leak_hang_or_concurrency() -> None:
    document = _document("burst-free-memory.json")  # served before /status had seconds_since_progress
    assert document["gpus"][0]["memory_growth_bytes_per_second"] is None
    assert "seconds_since_progress" not in document["engines"][0]
    assert _findings(document, version=None) == []


@pytest.mark.parametrize(
    "name", ["hang-restarted.json", "hang-idle-wedge.json", "kv-pressure.json", "leak-forecast.json"]
)
def test_every_recommendation_from_history_exists_in_the_version_it_is_made_for(name: str) -> None:
    document = _document(name)
    for version in ("0.5.4", "0.7.3", "0.10.2", "0.28.0", "0.32.0", None):
        document["vllm"]["version"] = version
        for finding in _findings(document, version=None):
            for recommendation in finding.recommendations:
                assert available(recommendation.flag, parse_version(version)), (version, recommendation)


def test_a_document_of_the_wrong_shape_is_one_line_and_a_missing_key_reads_as_unknown() -> None:
    """The document is checked against the schema the daemon writes it with (`sidecar.model.status`): values of
    the wrong type are refused in one line naming the key, and a key a newer sidecar added reads as unknown in a
    document an older one saved."""
    status = _document("kv-pressure.json")
    status["engines"][0]["engine_stalled_seconds"] = "long"
    with pytest.raises(
        HistoryError, match=r"^s is not the sidecar's /status document: engines\.0\.engine_stalled_seconds: "
    ):
        status_history(status, "s")
    older = _document("kv-pressure.json")
    del older["engines"][0]["seconds_since_progress"], older["problems"]
    facts = status_history(older, "s")
    assert facts.engines[0]["seconds_since_progress"] is None
    assert facts.status is not None
    assert facts.status["problems"] == []
    missing_total = _document("kv-pressure.json")
    del missing_total["gpus"][0]["memory_total_bytes"]
    with pytest.raises(HistoryError, match=r"gpus\.0\.memory_total_bytes: field required"):
        status_history(missing_total, "s")


# --- the version table against vLLM's own parser --------------------------------------------------------------


def test_every_flag_the_doctor_can_recommend_is_in_the_version_table() -> None:
    used = {flag for path in DOCTOR.glob("*.py") for flag in re.findall(r'flag="([^"]+)"', path.read_text())}
    assert used, "the doctor recommends something"
    assert used <= set(FLAGS), used - set(FLAGS)


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.5.4", None),  # V0 captures batch sizes up to max_num_seqs
        ("0.6.6", "--compilation-config"),
        ("0.8.5", "--compilation-config"),
        ("0.9.0", "--cuda-graph-sizes"),
        ("0.11.0", "--cuda-graph-sizes"),
        ("0.11.2", "--max-cudagraph-capture-size"),
        ("0.13.0", "--max-cudagraph-capture-size"),
        ("0.32.0", "--max-cudagraph-capture-size"),
        (None, None),
    ],
)
def test_the_graph_capture_sizes_flag_is_spelled_as_the_version_spells_it(
    version: str | None, flag: str | None
) -> None:
    assert graph_sizes_flag(parse_version(version)) == flag


# --- memory leaks ------------------------------------------------------------------------------------------------


def test_the_daemons_oom_forecast_is_a_memory_leak_with_the_restart_cadence() -> None:
    document = _document("leak-forecast.json")
    findings = _findings(document, version=None)
    assert [f.cause for f in findings] == [Cause.MEMORY_LEAK]
    leak = findings[0]
    assert leak.severity is Severity.CRITICAL, "the forecast OOM is within the hour"
    gpu = document["gpus"][0]
    growth, total, budget = gpu["memory_growth_bytes_per_second"], gpu["memory_total_bytes"], gpu["memory_budget_bytes"]
    assert any(f"memory grows {growth / 2**20:,.2f} MiB/s" in line and f"R² {gpu['memory_growth_fit_r2']:.3f}" in line
               for line in leak.evidence)  # fmt: skip
    fresh = (total - budget) / growth
    assert any(f"= {fresh:,.0f} s until the card is full" in line for line in leak.evidence)
    assert any("no room for a planned restart" in line for line in leak.evidence), "the simulator leaks fast"
    assert any("restarts cannot carry this leak" in step for step in leak.steps)
    assert any("_record_memory_history" in step for step in leak.steps)
    assert any("vLLM 0.32.0" in step and "R² 0.966" in step for step in leak.steps)
    assert _flags(leak) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_a_planned_restart_the_trend_no_longer_shows_is_still_a_leak_and_no_trend_yet_is_nothing() -> None:
    leak = _one(_findings(_document("leak-draining-trend-lost.json"), version=None), Cause.MEMORY_LEAK)
    assert leak.severity is Severity.WARNING
    assert any("restart (oom_forecast) begins" in line for line in leak.evidence)
    assert _findings(_document("leak-before-the-trend.json"), version=None) == []


def test_a_slow_leak_gives_a_restart_cadence_and_the_restart_budget_it_needs() -> None:
    document = copy.deepcopy(_document("leak-forecast.json"))
    gpu = document["gpus"][0]
    gpu["memory_total_bytes"], gpu["memory_budget_bytes"] = 80 * 2**30, 72 * 2**30
    gpu["memory_used_bytes"], gpu["memory_growth_bytes_per_second"] = 74 * 2**30, float(2**20)  # 1 MiB/s
    gpu["time_to_oom_seconds"] = 6 * 2**30 / 2**20
    document["policy"]["recent"] = []
    leak = _one(_findings(document, version=None), Cause.MEMORY_LEAK)
    # 8 GiB from a fresh start at 1 MiB/s = 8,192 s; minus the 900 s forecast = 7,292 s = 2.0 h between restarts.
    assert any("8,192 s" not in line and "= 2.3 h until the card is full" in line
               and "a planned restart every 2.0 h, 1 per hour at most, 11.8 a day" in line
               for line in leak.evidence)  # fmt: skip
    assert leak.severity is Severity.WARNING, "the OOM is 1.7 h away"
    assert any("one drain and restart every 2.0 h" in step and "at least 1" in step for step in leak.steps)


def test_growth_while_another_process_holds_memory_and_vllm_is_inside_its_budget_is_not_vllms_leak() -> None:
    document = copy.deepcopy(_document("leak-forecast.json"))
    gpu = document["gpus"][0]
    gpu["other_process_memory_bytes"], gpu["vllm_process_memory_bytes"] = 6 * 2**30, 70 * 2**30
    document["policy"]["recent"] = []
    assert _findings(document, version=None) == []
