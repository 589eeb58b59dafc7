"""The corpus of real vLLM failure logs (tests/doctor/corpus/index.toml): `doctor --vllm-log FILE --json` names an
accepted cause with a recommendation in range and none that points the wrong way (`corpus_verdict.verdict`), in
process, with no vLLM and no GPU. An entry the doctor still gets wrong says so (`known_miss`, with the reason):
it is expected to stay wrong until the reason is fixed, and the summary lists it."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from sidecar.cli import main
from tests.doctor.corpus_verdict import CORPUS, Verdict, entries, matches, verdict
from tests.loopback import closed_port

ENTRIES = entries()
SETS = {
    "issue-14",
    "dev-25",
    "heldout-25",
    "heldout-25b",
    "heldout-25c",
    "heldout-25d",
    "heldout-25e",
    "heldout-25f",
    "heldout-25g",
    "heldout-25h",
    "heldout-25i",
    "heldout-25j",
    "heldout-25k",
    "heldout-25l",
    "heldout-25m",
    "heldout-25n",
    "heldout-25o",
    "heldout-25p",
    "heldout-25q",
    "heldout-25r",
    "heldout-25s",
    "heldout-25t",
    "heldout-25u",
    "heldout-25v",
    "heldout-25w",
    "heldout-25x",
    "heldout-25y",
    "heldout-25z",
    "heldout-25aa",
    "heldout-25ab",
    "heldout-25ac",
    "heldout-25ad",
    "heldout-25ae",
    "heldout-25af",
    "heldout-25ag",
    "heldout-25ah",
    "heldout-25ai",
    "heldout-25aj",
    "heldout-25ak",
    "heldout-25al",
    "heldout-25am",
    "heldout-25an",
    "heldout-25ao",
    "heldout-25ap",
    "heldout-25aq",
    "heldout-25ar",
    "heldout-25as",
    "heldout-25at",
    "heldout-25au",
    "heldout-25av",
    "heldout-25aw",
    "heldout-25ax",
    "heldout-25ay",
    "heldout-25az",
    "heldout-25ba",
    "heldout-25bb",
    "heldout-25bc",
    "heldout-25bd",
    "heldout-25be",
    "heldout-25bf",
    "heldout-25bg",
    "heldout-25bh",
    "heldout-25bi",
    "heldout-25bj",
    "heldout-25bk",
    "heldout-25bl",
    "heldout-25bm",
    "heldout-25bn",
}


def _doctor(capsys: pytest.CaptureFixture[str], log: str) -> tuple[int, dict[str, Any]]:
    code = main(
        [
            "doctor",
            "--vllm-log",
            log,
            "--json",
            "--gpu-source",
            "none",
            "--vllm-url",
            f"http://127.0.0.1:{closed_port()}",
        ]
    )
    return code, json.loads(capsys.readouterr().out)


def test_the_corpus_is_whole() -> None:
    files = sorted(path.name for path in CORPUS.glob("*.log"))
    assert sorted(entry["file"] for entry in ENTRIES) == files
    assert len(files) >= 25
    for entry in ENTRIES:
        assert entry["source"].startswith("https://github.com/") or entry["set"] != "issue-14", entry["file"]
        assert all(entry[key] for key in ("arithmetic", "version", "shape", "causes")), entry["file"]
        assert entry["set"] in SETS, entry["file"]
        assert entry["set"] == "issue-14" or "first_contact" in entry, f"{entry['file']}: first contact not recorded"


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["file"] for entry in ENTRIES])
def test_corpus_log(entry: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, document = _doctor(capsys, str(CORPUS / entry["file"]))
    found = verdict(entry, code, document)
    if "known_wrong" in entry:  # listed in docs/doctor.md: the doctor still points the way the answer calls wrong
        assert found is Verdict.WRONG_DIRECTION, (
            f"no longer the wrong way: make it a known_miss ({entry['known_wrong']})"
        )
        pytest.xfail(f"known wrong direction: {entry['known_wrong']}")
    if "known_miss" in entry:
        assert found is not Verdict.RIGHT, f"fixed: drop known_miss ({entry['known_miss']})"
        assert found is not Verdict.WRONG_DIRECTION, "a known miss may miss, never point the wrong way"
        pytest.xfail(f"known miss ({found}): {entry['known_miss']}")
    assert found is Verdict.RIGHT, json.dumps(document.get("findings", []), indent=1)[:3000]
    assert all(r["why"] for f in document["findings"] for r in f["recommendations"]), "every value has its arithmetic"


def test_the_verdict_reads_ranges_values_switches_and_wrong_directions() -> None:
    assert matches({"flag": "--max-model-len", "min": 100, "max": 200}, "--max-model-len", 150)
    assert not matches({"flag": "--max-model-len", "max": 200}, "--max-model-len", 201)
    assert not matches({"flag": "--max-model-len", "min": 1}, "--max-num-seqs", 5)
    assert matches({"flag": "--enforce-eager", "value": ""}, "--enforce-eager", "")
    assert matches({"flag": "--quantization", "values": ["fp8", "awq"]}, "--quantization", "awq")
    assert matches({"flag": "PYTORCH_CUDA_ALLOC_CONF"}, "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    entry = {
        "causes": ["kv_cache_blowout"],
        "expect": [{"flag": "--max-model-len", "max": 4096}],
        "wrong": [{"flag": "--gpu-memory-utilization", "max": 0.89}],
    }

    def said(cause: str, *recommendations: tuple[str, object]) -> dict[str, Any]:
        recs = [{"flag": flag, "value": value, "why": "w"} for flag, value in recommendations]
        return {"findings": [{"cause": cause, "recommendations": recs}]}

    assert verdict(entry, 1, said("kv_cache_blowout", ("--max-model-len", 4096))) is Verdict.RIGHT
    assert verdict(entry, 1, said("kv_cache_blowout", ("--max-model-len", 8192))) is Verdict.OUT_OF_RANGE
    assert verdict(entry, 1, said("does_not_fit", ("--max-model-len", 4096))) is Verdict.WRONG_CAUSE
    wrong = said("kv_cache_blowout", ("--max-model-len", 4096), ("--gpu-memory-utilization", 0.85))
    assert verdict(entry, 1, wrong) is Verdict.WRONG_DIRECTION
    assert verdict(entry, 0, {"findings": []}) is Verdict.NO_FINDING
    assert verdict(entry, 2, {}) is Verdict.NO_FINDING


def test_stdin_is_read_with_a_dash(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    raw = (CORPUS / "v1-sampler-warmup-wrapped.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    code, document = _doctor(capsys, "-")
    assert code == 1
    assert document["findings"][0]["recommendations"][0] == {
        "flag": "--max-num-seqs",
        "value": 512,
        "why": document["findings"][0]["recommendations"][0]["why"],
    }
