"""The exposition parser under generated input: valid text against the grammar and prometheus_client, any
text against its error contract.

Witnesses: the grammar's own meaning of each line (`GenSample`) and prometheus_client's parser. Where
prometheus_client reads a valid 0.0.4 text differently, the difference is encoded exactly, nothing looser:
a counter's sample without `_total` gets the suffix (`_as_reference`), and "-0" is 0 (`_unsigned_zero`).
On invalid text the contract is one `ExpositionError` of one line, never another exception; there the two
parsers are not compared, as the sidecar checks less in lines it does not keep (and in TYPE names) by design.
"""

from __future__ import annotations

import math
import re

from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sidecar.model.exposition import Exposition, Sample
from sidecar.parse.exposition import REFUSED_METADATA, ExpositionError, parse_exposition, parse_lines
from sidecar.parse.pick import SamplePicker
from sidecar.parse.vllm import KEPT_SAMPLES, vllm_sample_picker
from tests.property.exposition_grammar import GenExposition, GenSample, expositions
from tests.property.profile import budget
from tests.unit.test_exposition_conformance import CASES, case_text, sample_names_at_line_starts

Row = tuple[str, tuple[tuple[str, str], ...], str]  # name, sorted labels, value (repr; NaN as "nan")


def _value_key(value: float) -> str:
    return "nan" if math.isnan(value) else repr(float(value))


def _comparable(samples: dict[str, tuple[Sample, ...]]) -> dict[str, list[tuple[object, str]]]:
    """`Exposition.samples` with NaN equal to NaN (a dataclass compares NaN fields as unequal)."""
    return {name: [(s.labels, _value_key(s.value)) for s in found] for name, found in samples.items()}


def _ours(exposition: Exposition) -> list[GenSample]:
    return [
        GenSample(name=sample.name, labels=sample.labels, value=sample.value)
        for samples in exposition.samples.values()
        for sample in samples
    ]


def _rows(samples: list[GenSample]) -> list[Row]:
    return sorted((s.name, tuple(sorted(s.labels)), _value_key(s.value)) for s in samples)


def _by_name(samples: list[GenSample] | tuple[GenSample, ...]) -> dict[str, list[tuple[object, str]]]:
    """Samples per name in line order, values comparable (NaN equal to NaN)."""
    grouped: dict[str, list[tuple[object, str]]] = {}
    for sample in samples:
        grouped.setdefault(sample.name, []).append((sample.labels, _value_key(sample.value)))
    return grouped


def _reference(text: str) -> list[Row]:
    return sorted(
        (sample.name, tuple(sorted(sample.labels.items())), _value_key(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def _unsigned_zero(rows: list[Row]) -> list[Row]:
    # prometheus_client reads an integer-looking value with int(), which has no negative zero: "-0" is 0.
    return sorted((name, labels, "0.0" if value == "-0.0" else value) for name, labels, value in rows)


def _as_reference(samples: list[GenSample], types: dict[str, str]) -> list[GenSample]:
    """What prometheus_client reports for these samples.

    It converts a counter family into the OpenMetrics model, where a counter's sample is `<name>_total`: a
    sample of a `# TYPE x counter` family whose name lacks `_total` is reported as `x_total`. The sidecar,
    like Prometheus itself, keeps the name as written, which is what the sidecar's name lists are about.
    """
    return [
        GenSample(name=s.name + "_total", labels=s.labels, value=s.value)
        if types.get(s.name) == "counter" and not s.name.endswith("_total")
        else s
        for s in samples
    ]


@budget()
@given(expositions())
@example(  # blanks before a sample (the format ignores leading blanks; the parser used to reject the line)
    GenExposition(text="  m 1\n", samples=(GenSample("m", (), 1.0),), types={}),
)
@example(  # blanks between a name and its labels (allowed between any tokens; used to be "invalid sample value")
    GenExposition(text='m {a="1"} 2\n', samples=(GenSample("m", (("a", "1"),), 2.0),), types={}),
)
@example(  # Go's ParseFloat reads "Infinity"; the filtered parse's shape check used to refuse a line ending in "y"
    GenExposition(text="other -Infinity\n", samples=(GenSample("other", (), -math.inf),), types={}),
)
@example(  # "5." is a value too (ParseFloat reads it); the shape check refused a skipped line ending in "."
    GenExposition(text="a 0.\n", samples=(GenSample("a", (), 0.0),), types={}),
)
@example(  # a TYPE line indented like any other line
    GenExposition(text="  # TYPE m gauge\nm 1\n", samples=(GenSample("m", (), 1.0),), types={"m": "gauge"}),
)
def test_valid_expositions_parse_to_their_meaning_as_prometheus_client_reads_them(generated: GenExposition) -> None:
    """One generated text, three witnesses (generation dominates the cost, so they share it)."""
    exposition = parse_exposition(generated.text)
    # 1. The grammar's meaning: every sample, its labels in written order, per name in line order; the types.
    assert _by_name(_ours(exposition)) == _by_name(generated.samples)
    assert exposition.types == generated.types
    assert exposition.names_seen == {sample.name for sample in generated.samples}
    # 2. prometheus_client, with its one documented difference (and its unsigned integer zero).
    ours = _rows(_as_reference(_ours(exposition), exposition.types))
    assert _unsigned_zero(ours) == _unsigned_zero(_reference(generated.text))
    # 3. The filtered parse the source runs every tick: exactly the kept samples of the full parse.
    filtered = parse_exposition(generated.text, KEPT_SAMPLES)
    kept = {name: samples for name, samples in exposition.samples.items() if name in KEPT_SAMPLES}
    assert _comparable(filtered.samples) == _comparable(kept)
    assert filtered.names_seen == exposition.names_seen
    assert filtered.types == exposition.types
    # 4. The picker the daemon runs every tick: the same kept samples, read anew and from remembered label sets.
    picker = vllm_sample_picker()
    assert _comparable(picker.pick(generated.text).samples) == _comparable(kept)
    assert _comparable(picker.pick(generated.text).samples) == _comparable(kept)


def _only_exposition_errors(text: str, keep: frozenset[str] | None, *, pick: bool = False) -> Exposition | None:
    try:
        return SamplePicker(keep or ()).pick(text) if pick else parse_exposition(text, keep)
    except ExpositionError as error:
        problem = error
    assert "\n" not in str(problem)  # one line, whatever the input
    assert 1 <= problem.line_number <= text.count("\n") + 1
    return None


# Characters that steer into every branch of the scanner, plus anything at all.
_tokens = st.sampled_from(
    [
        "vllm:num_requests_running",
        "m",
        "{",
        "}",
        '="',
        '"',
        ",",
        "\\",
        " ",
        "\t",
        "\n",
        "\r",
        "#",
        " TYPE ",
        " HELP ",
        "counter",
        "1",
        "1e5",
        "NaN",
        "+Inf",
        "_",
        "le=",
        "\x00",
        "\u2003",
        "\x85",
    ]
)
_noise = st.lists(st.one_of(_tokens, st.text(max_size=3)), max_size=40).map("".join)


@budget(scale=2)
@given(st.one_of(st.text(), _noise), st.sampled_from([None, KEPT_SAMPLES]))
def test_any_text_parses_or_fails_with_one_exposition_error(text: str, keep: frozenset[str] | None) -> None:
    _only_exposition_errors(text, keep)
    _only_exposition_errors(text, keep, pick=True)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    """A valid exposition with a few characters replaced, inserted or deleted: near-valid, the hardest input."""
    text = draw(expositions(max_families=3)).text
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(st.one_of(_tokens, st.text(max_size=2))) + text[at + cut :]
    return text


@budget()
@given(_mutated())
def test_near_valid_text_parses_or_fails_cleanly_and_filtering_never_rejects_more(text: str) -> None:
    full = _only_exposition_errors(text, None)
    filtered = _only_exposition_errors(text, KEPT_SAMPLES)
    if full is not None:
        # The filtered parse checks less, never more: what the full parse accepts, it accepts identically.
        assert filtered is not None
        kept = {name: samples for name, samples in full.samples.items() if name in KEPT_SAMPLES}
        assert _comparable(filtered.samples) == _comparable(kept)
        # The picker checks less still (not the lines it does not read), and reads the kept ones identically.
        picked = _only_exposition_errors(text, KEPT_SAMPLES, pick=True)
        assert picked is not None
        assert _comparable(picked.samples) == _comparable(kept)


# The published conformance cases (tests/unit/exposition_conformance_cases.json) as seeds: near-valid text of
# every shape those test suites thought of.
_CONFORMANCE_TEXTS = sorted({text for case in CASES if (text := case_text(case)) is not None})


@st.composite
def _mutated_conformance_case(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(_CONFORMANCE_TEXTS))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(st.one_of(_tokens, st.text(max_size=2))) + text[at + cut :]
    return text


@budget()
@given(_mutated_conformance_case())
def test_conformance_cases_mutated_parse_or_fail_cleanly_and_the_picker_reads_them_alike(text: str) -> None:
    full = _only_exposition_errors(text, None)
    names = frozenset(sample_names_at_line_starts(text))
    picked = _only_exposition_errors(text, names, pick=True)
    if full is not None:
        # Built to read every name at a line's start, the picker reads every sample line: the same samples.
        assert picked is not None
        assert _comparable(picked.samples) == _comparable(full.samples)


_refused_metadata = re.compile(f"[ \t]*(?:{REFUSED_METADATA})")
_metadata_pieces = st.sampled_from(
    ["#", " ", "\t", "  ", "HELP", "TYPE", "m", "a_b:c", "9", "-", "{", "counter", "gauge", "untyped", "info", "\r"]
)


@budget()
@given(st.lists(_metadata_pieces, max_size=8).map(lambda pieces: "#" + "".join(pieces)), st.sampled_from(["", " "]))
@example("# HELP  HELP", "")  # two blanks before the name: the search must not give one back to find none after it
@example("# TYPE\t m counter", " ")
def test_the_pickers_search_finds_exactly_the_metadata_lines_the_line_parser_refuses(line: str, indent: str) -> None:
    line = indent + line
    try:
        parse_lines(line, frozenset())
        accepted = True
    except ExpositionError:
        accepted = False
    found = _refused_metadata.match(line + "\n") is not None
    assert found == (not accepted)
