"""The exposition parser and the tick's picker against Prometheus, on the published parser test cases.

The cases (`exposition_conformance_cases.json`, recorded by `exposition_conformance_record.py`) are every
input of promparse_test.go (prometheus/prometheus), expfmt's text_parse_test.go (prometheus/common),
client_python's tests/test_parser.py and the OpenMetrics parser test data, each judged as format 0.0.4 by a
real Prometheus scrape (and by expfmt, through promtool, for information). The parser must accept exactly
what Prometheus accepts, with the values Prometheus stored, except where a case says `why` not; the picker,
built to read every sample name of the case, must do what the full parse does.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sidecar.model.exposition import Exposition
from sidecar.parse.exposition import ExpositionError, parse_exposition
from sidecar.parse.pick import SamplePicker

CASES: list[dict[str, Any]] = json.loads(Path(__file__).with_name("exposition_conformance_cases.json").read_text())
_LINE_START_NAME = re.compile(r"^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], str]


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['source'].split()[0]}:{case['case']}"


def case_text(case: dict[str, Any]) -> str | None:
    """The case as the sidecar receives it: UTF-8 decoded (None: not UTF-8, which the adapters refuse)."""
    try:
        return str(case["text"]).encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeDecodeError:
        return None


def sample_names_at_line_starts(text: str) -> list[str]:
    """Every name at a line's start: a picker built to read them reads every sample line."""
    return _LINE_START_NAME.findall(text)


def _parsed(case: dict[str, Any]) -> Exposition | None:
    text = case_text(case)
    if text is None:
        return None
    try:
        return parse_exposition(text)
    except ExpositionError:
        return None


def _series(exposition: Exposition) -> Series:
    """Each series' first value, as Prometheus stores one scrape: a repeated series keeps its first sample, and a
    label with an empty value is no label (Prometheus' data model; the parser reports what was written)."""
    found: Series = {}
    for samples in exposition.samples.values():
        for sample in samples:
            key = (sample.name, tuple(sorted(label for label in sample.labels if label[1])))
            found.setdefault(key, "NaN" if math.isnan(sample.value) else repr(sample.value))
    return found


def _stored(case: dict[str, Any]) -> Series:
    def normal(value: str) -> str:
        number = float(value)
        return "NaN" if math.isnan(number) else repr(number)

    return {(name, tuple((k, v) for k, v in labels)): normal(value) for name, labels, value in case["samples"]}


def test_the_cases_are_all_there() -> None:
    sources = Counter(case["source"] for case in CASES)
    assert sources == {
        "prometheus/prometheus model/textparse/promparse_test.go": 29,
        "prometheus/common expfmt/text_parse_test.go": 66,
        "prometheus/client_python tests/test_parser.py": 47,
        "prometheus/OpenMetrics tests/testdata/parsers": 211,
    }
    # Every departure from Prometheus says why; no other case departs.
    for case in CASES:
        assert (case["expect"] != case["prometheus"]) == ("why" in case), _case_id(case)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_parser_accepts_what_prometheus_accepts_with_its_values(case: dict[str, Any]) -> None:
    parsed = _parsed(case)
    assert ("accept" if parsed is not None else "reject") == case["expect"]
    if parsed is None or case["prometheus"] != "accept":
        return
    ours, stored = _series(parsed), _stored(case)
    if case["samples_complete"]:
        assert ours == stored
    else:  # Prometheus parsed more than it stored (old timestamps): what it stored, we read alike
        assert {key: ours.get(key) for key in stored} == stored


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_picker_does_what_the_full_parse_does(case: dict[str, Any]) -> None:
    text = case_text(case)
    if text is None:
        return
    full = _parsed(case)
    picker = SamplePicker(sample_names_at_line_starts(text))
    for _ in range(2):  # read anew, then from the label sets it remembered
        try:
            picked: Exposition | None = picker.pick(text)
        except ExpositionError:
            picked = None
        assert (picked is None) == (full is None)
        if picked is not None and full is not None:
            assert _series(picked) == _series(full)
