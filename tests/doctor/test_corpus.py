"""The corpus of real vLLM failure logs (tests/doctor/corpus/index.toml): `doctor --vllm-log FILE --json` names the
cause and recommends a value in the range worked out by hand for each. In process, with no vLLM and no GPU."""

from __future__ import annotations

import io
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from tests.loopback import closed_port

CORPUS = Path(__file__).parent / "corpus"
ENTRIES: list[dict[str, Any]] = tomllib.loads((CORPUS / "index.toml").read_text())["log"]


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
        assert entry["source"].startswith("https://github.com/"), entry["file"]
        assert all(entry[key] for key in ("arithmetic", "version", "shape")), entry["file"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["file"] for entry in ENTRIES])
def test_corpus_log(entry: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, document = _doctor(capsys, str(CORPUS / entry["file"]))
    assert code == 1, "a failure log is diagnosed with a finding (exit 1), even with no start line"
    finding = document["findings"][0]
    assert finding["cause"] == entry["cause"]
    recommended = {r["flag"]: r["value"] for r in finding["recommendations"]}
    for expected in entry["expect"]:
        value = recommended.get(expected["flag"])
        assert value is not None, f"{expected['flag']} missing from {recommended}"
        if "value" in expected:
            assert value == expected["value"]
        else:
            assert expected["min"] <= value <= expected["max"], f"{expected['flag']} {value}"
    for flag in entry.get("absent", []):
        assert flag not in recommended, f"{flag} must not be recommended: {recommended}"
    assert all(r["why"] for r in finding["recommendations"]), "every value comes with its arithmetic"


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
