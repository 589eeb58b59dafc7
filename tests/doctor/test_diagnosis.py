"""The whole diagnosis: which rules run, the notes, the contract's JSON document, text and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Diagnosis, Finding, Recommendation, Severity
from sidecar.doctor.history import HistoryError, from_ledger
from sidecar.doctor.logfacts import Refusal, RefusalKind
from sidecar.doctor.render import document, exit_code, paste, render_json, render_text
from sidecar.doctor_cli.history_reading import status_history
from tests.doctor.builders import (
    GIB,
    args,
    engine,
    engine_status,
    evidence,
    gpu,
    gpu_status,
    gpus,
    live,
    log,
    reading,
    status_document,
    traffic,
)

STATUS = Path(__file__).parent / "status"


def test_nothing_readable_is_not_a_diagnosis() -> None:
    result = diagnose(evidence(live_evidence=live(error="http://vllm/metrics unreachable: connection refused")))
    assert not result.diagnosable
    assert exit_code(result) == 2
    assert result.reason is not None
    assert "give --vllm-log FILE" in result.reason
    with_useless_log = evidence(live_evidence=live(error="refused"), log_facts=log(lines_recognised=0))
    result = diagnose(with_useless_log)
    assert result.reason is not None
    assert "has no vLLM start, refusal or crash line" in result.reason


def test_a_log_alone_is_enough() -> None:
    refusal = Refusal(
        kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="ValueError: ...", max_model_len=8192, capacity_tokens=4096
    )
    result = diagnose(evidence(live_evidence=live(error="refused", version=None), log_facts=log(refusal=refusal)))
    assert result.diagnosable
    assert exit_code(result) == 1
    assert [(f.cause, f.severity) for f in result.findings] == [(Cause.KV_CACHE_BLOWOUT, Severity.CRITICAL)]
    assert any("vLLM version unknown" in note for note in result.notes)


def test_findings_are_ordered_by_severity_then_cause() -> None:
    preempting = reading(engine(preemptions_total=8.0))
    load = traffic([900.0] * 60, [150.0] * 60, latencies=[2.0] * 60)
    ev = evidence(
        live_evidence=live(max_model_len=32768, load=load, vllm=preempting),
        gpu_evidence=gpus(gpu(used=int(76.75 * GIB), others=((31337, 6 * GIB, "python train.py"),))),
        log_facts=log(args=args(max_num_seqs=64)),
    )
    result = diagnose(ev)
    assert [(f.cause.value, f.severity.value) for f in result.findings] == [
        ("configuration_overshoot", "critical"),
        ("kv_cache_blowout", "warning"),
        ("concurrency_misjudgement", "warning"),  # the default 4,096-token pool holds 3.9 requests; 64 are allowed
        ("other", "info"),  # --shutdown-timeout on 0.32
    ]
    assert any("GPU: 1 device(s) read from sim" in note for note in result.notes)


def test_the_notes_say_what_is_missing() -> None:
    result = diagnose(evidence(live_evidence=live(load=traffic([100.0] * 3, [10.0] * 3))))
    notes = " | ".join(result.notes)
    assert "GPU evidence missing (--gpu-source none)" in notes
    assert "no log (--vllm-log)" in notes
    assert "traffic too thin for percentiles: 3 finished requests" in notes


FINDING = Finding(
    cause=Cause.KV_CACHE_BLOWOUT,
    severity=Severity.WARNING,
    summary="s",
    evidence=("max_model_len 32,768",),
    recommendations=(Recommendation(flag="--max-model-len", value=2048, why="p99 ... -> 2048"),),
)


def _diagnosis(*findings: Finding) -> Diagnosis:
    return Diagnosis(
        version="0.32.0", reachable=True, url="http://vllm", findings=findings, notes=("n",), diagnosable=True
    )


def test_the_contract_document() -> None:
    parsed = json.loads(render_json(_diagnosis(FINDING)))
    assert parsed["vllm"] == {"version": "0.32.0", "reachable": True, "url": "http://vllm"}
    assert parsed["findings"] == [
        {
            "cause": "kv_cache_blowout",
            "severity": "warning",
            "summary": "s",
            "evidence": ["max_model_len 32,768"],
            "recommendations": [{"flag": "--max-model-len", "value": 2048, "why": "p99 ... -> 2048"}],
            "steps": [],
        }
    ]
    assert document(_diagnosis())["findings"] == []


@pytest.mark.parametrize(
    ("severity", "fail_on", "code"),
    [
        (Severity.INFO, Severity.WARNING, 0),
        (Severity.INFO, Severity.INFO, 1),
        (Severity.WARNING, Severity.WARNING, 1),
        (Severity.WARNING, Severity.CRITICAL, 0),
        (Severity.CRITICAL, Severity.CRITICAL, 1),
    ],
)
def test_exit_code_like_a_linter(severity: Severity, fail_on: Severity, code: int) -> None:
    finding = Finding(cause=Cause.OTHER, severity=severity, summary="s", evidence=("e",))
    assert exit_code(_diagnosis(finding), fail_on) == code
    assert exit_code(_diagnosis(), Severity.INFO) == 0


def test_by_default_any_finding_exits_1_as_the_contract_says() -> None:
    advice = Finding(cause=Cause.OTHER, severity=Severity.INFO, summary="s", evidence=("e",))
    assert exit_code(_diagnosis(advice)) == 1


def test_text_groups_evidence_and_recommendations_by_finding() -> None:
    text = render_text(_diagnosis(FINDING))
    assert "[WARNING] kv_cache_blowout: s\n  evidence:\n    - max_model_len 32,768\n  recommendations:\n" in text
    assert "    --max-model-len 2048\n        p99 ... -> 2048" in text


@pytest.mark.parametrize(
    ("flag", "value", "pasted"),
    [
        ("--max-model-len", 2048, "--max-model-len 2048"),
        ("--enforce-eager", "", "--enforce-eager"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        ("terminationGracePeriodSeconds", 40, "terminationGracePeriodSeconds: 40"),
    ],
)
def test_recommendations_paste_as_a_flag_an_environment_variable_or_a_pod_field(
    flag: str, value: int | str, pasted: str
) -> None:
    assert paste(Recommendation(flag=flag, value=value, why="w")) == pasted


def test_history_from_the_daemons_status_document() -> None:
    policy = json.loads((STATUS / "kv-pressure.json").read_text())["policy"]
    policy["restarts"] = {"oom_forecast": 2, "engine_dead": 0}
    status = status_document(
        engines=[engine_status(prefix_cache_hit_ratio=0.4), engine_status(engine="1", prefix_cache_hit_ratio=0.1)],
        gpus=[gpu_status(0, memory_growth_bytes_per_second=1e6, memory_growth_fit_r2=0.9, time_to_oom_seconds=100.0)],
        policy=policy,
    )
    facts = status_history(status, "s")
    assert facts.prefix_hit_ratio_window == 0.1
    assert [(gpu["gpu"], gpu["time_to_oom_seconds"]) for gpu in facts.gpus] == [(0, 100.0)]
    assert facts.restarts == (("oom_forecast", 2),)


@pytest.mark.parametrize("garbage", [None, [], "text", {"engines": "no"}, {"sidecar": {}}])
def test_garbage_history_is_an_error_line(garbage: object) -> None:
    with pytest.raises(HistoryError, match=r"^file\.json is not the sidecar's /status document: "):
        status_history(garbage, "file.json")


def test_history_from_the_restart_ledger() -> None:
    ledger = {"version": 1, "restarts": [{"wall_time_s": 1.0, "reason": "oom_forecast"},
                                         {"wall_time_s": 2.0, "reason": "oom_forecast"}]}  # fmt: skip
    assert from_ledger(ledger, "dir").restarts == (("oom_forecast", 2),)
    with pytest.raises(HistoryError, match="not a restart ledger"):
        from_ledger({"version": 99}, "dir")
