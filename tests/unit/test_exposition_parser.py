"""The exposition parser against prometheus_client's parser (the reference) and on malformed input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.parse.exposition import ExpositionError, parse_exposition
from sidecar.parse.pick import SamplePicker
from sidecar.parse.vllm import KEPT_SAMPLES
from tests.conftest import exposition_files

Flat = list[tuple[str, tuple[tuple[str, str], ...], float]]


def _reference(text: str) -> Flat:
    return sorted(
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def _ours(text: str, keep: frozenset[str] | None = None) -> Flat:
    exposition = parse_exposition(text, keep)
    return sorted(
        (sample.name, tuple(sorted(sample.labels)), sample.value)
        for samples in exposition.samples.values()
        for sample in samples
    )


def _same(left: Flat, right: Flat) -> bool:
    def normal(rows: Flat) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
        return [(name, labels, "nan" if math.isnan(value) else repr(value)) for name, labels, value in rows]

    return normal(left) == normal(right)


def test_there_are_recorded_expositions_including_the_real_captures() -> None:
    names = {path.name for path in exposition_files()}
    assert "vllm-0.32.0-cpu-under-load.prom" in names
    assert "vllm-0.32.0-cpu-after-load.prom" in names
    assert len(names) >= 8


@pytest.mark.parametrize("path", exposition_files(), ids=lambda path: path.name)
def test_full_parse_agrees_with_prometheus_client(path: Path) -> None:
    text = path.read_text()
    reference = _reference(text)
    assert reference, "the reference parser found nothing: the fixture is empty"
    assert _same(_ours(text), reference)


@pytest.mark.parametrize("path", exposition_files(), ids=lambda path: path.name)
def test_filtered_parse_keeps_exactly_the_wanted_samples(path: Path) -> None:
    text = path.read_text()
    wanted = [row for row in _reference(text) if row[0] in KEPT_SAMPLES]
    assert _same(_ours(text, KEPT_SAMPLES), wanted)


def test_names_seen_covers_skipped_samples() -> None:
    exposition = parse_exposition('a_total 1\nb{x="1"} 2\n', keep={"a_total"})
    assert exposition.names_seen == {"a_total", "b"}
    assert exposition.get("b") == ()


def test_escapes_timestamps_and_special_values() -> None:
    text = (
        "# HELP m a metric\n# TYPE m gauge\n"
        'm{path="C:\\\\x",quote="say \\"hi\\"",nl="a\\nb",odd="\\q"} 1.5 1700000000000\n'
        "m{} +Inf\nm -Inf\nm NaN\r\n"
    )
    exposition = parse_exposition(text)
    first, *rest = exposition.get("m")
    assert dict(first.labels) == {"path": "C:\\x", "quote": 'say "hi"', "nl": "a\nb", "odd": "\\q"}
    assert first.value == 1.5
    assert [sample.value for sample in rest[:2]] == [math.inf, -math.inf]
    assert math.isnan(rest[2].value)
    assert exposition.types == {"m": "gauge"}
    assert _same(_ours(text), _reference(text))


def test_label_values_may_hold_separators() -> None:
    exposition = parse_exposition('m{a="x,y}z=\\"",b = "2" , } 3\n')
    (sample,) = exposition.get("m")
    assert dict(sample.labels) == {"a": 'x,y}z="', "b": "2"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<html><body>502 Bad Gateway</body></html>\n", "valid metric name"),
        ("m\n", "valid metric name"),
        ("m{a=1} 2\n", "must be quoted"),
        ('m{a="1" 2\n', "separated by ','"),
        ('m{a="1\n', "unterminated value"),
        ('m{1a="1"} 2\n', "invalid label name"),
        ("m{a} 2\n", "needs '='"),
        ("m one\n", "invalid sample value"),
        ("m 1_000\n", "invalid sample value"),
        ("m 1 2 3\n", "at most a timestamp"),
        ("m 1 soon\n", "invalid timestamp"),
        ("m{\n", "unterminated label set"),
        ("# TYPE m\n", "TYPE line"),
        ("# TYPE m flavour\n", "unknown metric type"),
        ("m-x 1\n", "valid metric name"),
        # What Prometheus refuses and Python's float() and int() would read (issue 15):
        ('m{a="1",a="2"} 1\n', "label name 'a' is not unique"),
        ('m{a="1", b="2",a="3"} 1\n', "label name 'a' is not unique"),  # the scanner's path (blanks)
        ('m{__name__="n"} 1\n', "label name '__name__' is not unique"),
        ("m 1 1_700\n", "invalid timestamp"),
        ("m 1 -5\n", "invalid timestamp"),  # Prometheus' lexer reads digits only
        ("m 1 +5\n", "invalid timestamp"),
        ("m 1 9223372036854775808\n", "timestamp '9223372036854775808' is out of range"),
        ("m \u0661\u0662\n", "invalid sample value"),  # Arabic-Indic digits: float() reads 12
        ("m \uff11\n", "invalid sample value"),  # a fullwidth digit
        ("m 1 \u0661\u0662\n", "invalid timestamp"),
        ("m 1\u20032\n", "invalid sample value"),  # an em space is no separator (str.split() thinks it is)
        ("m +NaN\n", "invalid sample value"),  # Go's ParseFloat reads NaN without a sign
        ("m 1e400\n", "out of range"),  # float() gives inf, ParseFloat an error
        ("# TYPE m info\n", "unknown metric type 'info'"),
        ("# TYPE m stateset\n", "unknown metric type 'stateset'"),
        ("# TYPE m gaugehistogram\n", "unknown metric type 'gaugehistogram'"),
        ("# TYPE m unknown\n", "unknown metric type 'unknown'"),
        ("# TYPE m  gauge\n", "unknown metric type ' gauge'"),  # Prometheus reads all after one blank
        ("# TYPE m gauge \n", "unknown metric type 'gauge '"),
        ("# HELP \n", "a HELP line needs a metric name"),
        ("# HELP #\n", "a HELP line needs a metric name"),
        ("\t#\tTYPE\t9m gauge\n", "a TYPE line needs a metric name"),
    ],
)
def test_malformed_lines_are_rejected_with_their_line_number(text: str, reason: str) -> None:
    with pytest.raises(ExpositionError) as caught:
        parse_exposition("ok_metric 1\n" + text)
    assert caught.value.line_number == 2
    assert reason in str(caught.value)
    if text.lstrip(" \t")[:1] not in ("m", "#"):
        return  # a line the tick's picker does not read (see test_exposition_pick)
    # The tick's picker, reading that name, refuses the line alike (metadata it finds by its search).
    with pytest.raises(ExpositionError) as picked:
        SamplePicker({"m", "ok_metric"}).pick("ok_metric 1\n" + text + "ok_metric 2\n")
    assert picked.value.line_number == 2
    assert reason in str(picked.value)


@pytest.mark.parametrize(
    "text",
    [
        '# HELP\n# TYPE\n# HELPER m\n#TYPE m info\n# HELP m\n# HELP m text with "quotes"\nm 1\n',  # comments
        'm{a="1" b="2"} 1\n',  # no comma between labels: Prometheus reads two labels
        "m 1 0\nm 1 9223372036854775807\n",  # timestamps from 0 to int64's largest
        "m Inf\nm -infinity\nm nan\nm 5.\nm .5e-3\n",  # what Go's ParseFloat reads
        "# TYPE m counter\r\nm 1\r\n",  # CRLF (Prometheus refuses it; the sidecar keeps reading it)
    ],
)
def test_what_prometheus_reads_is_read(text: str) -> None:
    parse_exposition(text)
    SamplePicker({"m"}).pick(text)


def test_garbage_is_rejected_even_when_nothing_would_be_kept() -> None:
    with pytest.raises(ExpositionError):
        parse_exposition("\x00\x01binary\n", keep={"vllm:num_requests_running"})


@pytest.mark.parametrize("text", ["not an exposition at all\n", "html> <body>\n", 'x{a="1"} oops\n'])
def test_prose_is_rejected_even_in_families_that_are_skipped(text: str) -> None:
    with pytest.raises(ExpositionError, match=r"must end with a value|valid metric name"):
        parse_exposition(text, keep=KEPT_SAMPLES)


def test_skipped_lines_are_checked_only_for_shape() -> None:
    # A malformed value in a family the sidecar never reads does not fail the scrape...
    exposition = parse_exposition("other_metric 1.2.3\nvllm:num_requests_running 1\n", KEPT_SAMPLES)
    assert exposition.get("vllm:num_requests_running")[0].value == 1.0
    # ...but one in a family it reads does.
    with pytest.raises(ExpositionError):
        parse_exposition("vllm:num_requests_running x\n", KEPT_SAMPLES)


def test_blank_and_comment_lines_are_ignored() -> None:
    exposition = parse_exposition("\n   \n# just a comment\n# HELP m help text\nm 1\n")
    assert exposition.get("m")[0].value == 1.0
