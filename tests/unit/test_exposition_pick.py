"""The tick's picker (sidecar.parse.pick) against the strict parser it stands in for.

Oracles: `parse_exposition` (every line checked) on valid text, where the picked samples must be exactly its
kept samples, and on broken text a naive one written here: the strict line parser run on just the lines that
start with a kept name or '#' (found by a Python loop, not a regular expression), plus the first and last lines.
What the picker leaves unchecked on purpose (a malformed line of a family nobody reads) is pinned too.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.generate_exposition import generate_exposition
from sidecar.model.exposition import Exposition
from sidecar.parse.exposition import ExpositionError, parse_exposition, parse_lines
from sidecar.parse.pick import MAX_REMEMBERED_LABEL_SETS, SamplePicker
from sidecar.parse.vllm import KEPT_SAMPLES, read_vllm, vllm_sample_picker
from sidecar.sim.exposition import MetricsWriter
from sidecar.sim.exposition_cache import CacheSettings
from tests.conftest import exposition_files
from tests.property.profile import budget

# Odd shapes: a summary with quantiles, a histogram with a series missing its _sum, families without HELP, a
# kept name inside a foreign family.
ODD_FAMILIES = """# HELP s a summary with quantiles
# TYPE s summary
s{quantile="0.5"} 1
s_count 2
s_sum 3
# HELP t a summary without
# TYPE t summary
t_count{a="1"} 2
t_sum{a="1"} 3.5
# HELP h a histogram cut short
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 2
h_count 2
h_bucket{le="1"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
# HELP g a gauge
# TYPE g gauge
g 1
vllm:num_requests_waiting{engine="0",model_name="m"} 4
"""
TRICKY_LINES = [
    "",
    " ",
    "\r",
    "\t# TYPE vllm:kv_cache_usage_perc gauge",
    "# HELP vllm:num_requests_running",
    "# HELP x help",
    "# TYPE x gauge",
    "# TYPE x flavour",
    "# TYPE vllm:iteration_tokens_total histogram",
    "x 1",
    "x 1.2.3",
    'x{a="1"} oops',
    "# TYPE x summary",
    "x_count 1",
    "x_sum 2",
    'x{quantile="0.5"} 1',
    'x_bucket{le="1"} 1',
    'vllm:num_requests_running{engine="0",model_name="m"} 3',
    'vllm:num_requests_running{engine="0",model_name="m"} x',
    "vllm:num_requests_running 1 2 3",
    'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 7',
    " vllm:num_requests_waiting 2",
    'vllm:kv_cache_usage_perc {engine="0"} 0.5',
    "vllm:prompt_tokens_created 1.7e9",
    "not an exposition at all",
    "<html><body>502</body></html>",
    "\x00\x01binary",
]


def broken_exposition(data: st.DataObject, text: str) -> str:
    """`text` broken in the ways that matter: one to three lines inserted (tricky or arbitrary), dropped,
    doubled, swapped, or the body truncated in the middle of a line."""
    lines = text.split("\n")
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        kind = data.draw(st.sampled_from(["insert", "drop", "double", "swap", "truncate"]))
        if kind == "insert":
            lines.insert(at, data.draw(st.sampled_from(TRICKY_LINES) | st.text(max_size=20)))
        elif kind == "drop" and len(lines) > 1:
            del lines[at]
        elif kind == "double":
            lines.insert(at, lines[at])
        elif kind == "swap":
            other = data.draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif kind == "truncate":
            cut = data.draw(st.integers(0, len(lines[at])))
            lines = [*lines[:at], lines[at][:cut]]
    return "\n".join(lines)


def _simulated(version: str, engines: int) -> str:
    cache = CacheSettings(max_model_len=4096, num_gpu_blocks_per_engine=1000)
    return MetricsWriter(version, model_name="m", cache=cache, engines=engines).render(()).decode()


TEXTS = (
    [path.read_text() for path in exposition_files()]
    + [ODD_FAMILIES, generate_exposition(engines=4, lora_adapters=40)]
    + [_simulated(version, engines) for version, engines in (("0.6", 1), ("0.10", 1), ("0.32", 1), ("0.32", 3))]
)


def _kept(exposition: Exposition) -> str:
    # repr: NaN values compare equal to themselves, and dict order is part of the answer.
    return repr({name: found for name, found in exposition.samples.items() if name in KEPT_SAMPLES})


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_valid_expositions_pick_exactly_the_strict_parsers_kept_samples(index: int) -> None:
    picker = vllm_sample_picker()
    for text in (TEXTS[index], TEXTS[index].replace("\n", "\r\n")):
        strict = parse_exposition(text, KEPT_SAMPLES)
        first, again = picker.pick(text), picker.pick(text)  # the second reads remembered label sets
        assert _kept(first) == _kept(again) == _kept(strict)
        # What the daemon makes of it is the same, the schema (from the names noticed) included.
        assert read_vllm(first, url="u", version=None) == read_vllm(strict, url="u", version=None)


def test_values_that_move_under_remembered_labels_are_read_anew() -> None:
    picker = vllm_sample_picker()
    line = 'vllm:num_requests_running{engine="0",model_name="m"} {}\n'
    for value in ("1", "2.5", "NaN", "7 1700000000000"):
        picked = picker.pick(line.replace("{}", value))
        (sample,) = picked.samples["vllm:num_requests_running"]
        assert sample.labels == (("engine", "0"), ("model_name", "m"))
        assert repr(sample.value) == repr(float(value.split()[0]))
    with pytest.raises(ExpositionError, match="invalid sample value"):
        picker.pick(line.replace("{}", "1_0"))  # a remembered label set does not let a bad value through


def test_remembered_label_sets_are_bounded_and_stay_correct() -> None:
    picker = SamplePicker({"x"})
    for number in range(MAX_REMEMBERED_LABEL_SETS + 10):
        (sample,) = picker.pick(f'x{{id="{number}"}} {number}\n').samples["x"]
        assert sample.labels == (("id", str(number)),)
        assert sample.value == number
    assert len(picker._label_sets) <= MAX_REMEMBERED_LABEL_SETS


@pytest.mark.parametrize(
    ("text", "line_number", "reason"),
    [
        ("<html><body>502 Bad Gateway</body></html>\n", 1, "a sample line needs a valid metric name"),
        ('{"detail": "Not Found"}', 1, "a sample line needs a valid metric name"),
        ("# HELP x\nx 1\n<truncated", 3, "a sample line needs a valid metric name"),
        ('a 1\nvllm:num_requests_running{engine="0"} oops\nb 2\n', 2, "invalid sample value"),
        ('a 1\n\n  vllm:kv_cache_usage_perc{engine="0" 0.5\nb 2\n', 3, "labels must be separated"),
        ("a 1\nvllm:num_requests_waiting\nb 2\n", 2, "a sample line needs a valid metric name"),
    ],
)
def test_what_is_not_an_exposition_or_a_malformed_kept_line_is_an_error_numbered_in_the_text(
    text: str, line_number: int, reason: str
) -> None:
    with pytest.raises(ExpositionError, match=reason) as raised:
        vllm_sample_picker().pick(text)
    assert raised.value.line_number == line_number


def test_a_malformed_line_of_a_family_nobody_reads_leaves_the_kept_values_as_they_are() -> None:
    text = (
        'a 1\nhttp_requests_total{handler="/v1"} twelve\nvllm:num_requests_running{engine="0",model_name="m"} 3\nb 2\n'
    )
    with pytest.raises(ExpositionError):
        parse_exposition(text, KEPT_SAMPLES)  # the strict parse (the doctor's) still refuses the whole text
    (sample,) = vllm_sample_picker().pick(text).samples["vllm:num_requests_running"]
    assert sample.value == 3


def test_a_longer_name_that_starts_like_a_kept_one_is_not_picked() -> None:
    text = 'vllm:num_requests_running_total{engine="0"} 5\nvllm:num_requests_running{engine="0"} 3\n'
    picked = vllm_sample_picker().pick(text)
    assert [sample.value for sample in picked.samples["vllm:num_requests_running"]] == [3]
    assert "vllm:num_requests_running_total" not in picked.samples


def test_names_that_start_like_one_another_are_each_picked_whole() -> None:
    # The wanted names are searched for as a trie (shared starts compared once): a name that is also the start of
    # longer ones is found only where it ends, and each longer one wherever it stands.
    keep = {"a", "a_b", "a_bc", "ab", "b:c"}
    text = 'a_bc 1\na_b 2\n  a 3\nab 4\na_bcd 5\nabc 6\nb:c 7\nb:cd 8\na_b{x="1"} 9\n'
    picked = SamplePicker(keep).pick(text)
    values = {name: [sample.value for sample in found] for name, found in picked.samples.items()}
    assert values == {"a_bc": [1], "a_b": [2, 9], "a": [3], "ab": [4], "b:c": [7]}
    assert picked.samples == parse_exposition(text, keep).samples


def test_the_first_name_under_a_noticed_prefix_is_seen_on_the_first_line_or_any_later_one() -> None:
    picker = SamplePicker((), notice_prefixes=("p_",))
    assert picker.pick("  p_first 1\np_second 2\n").names_seen == {"p_first"}
    assert picker.pick("q 1\n\tp_second 2\np_third 3\n").names_seen == {"p_second"}
    assert picker.pick("q 1\nxp_no 2\n").names_seen == frozenset()


def test_names_seen_answer_what_the_reader_asks() -> None:
    picker = vllm_sample_picker()
    assert picker.pick("python_gc_objects_collected_total 1\n").names_seen == frozenset()
    seen = picker.pick("a 1\nvllm:something_new 2\nvllm:prompt_tokens_created 3\n").names_seen
    assert seen == {"vllm:something_new", "vllm:prompt_tokens_created"}
    assert picker.pick("").samples == {}


_NAME_CHARACTERS = string.ascii_letters + string.digits + "_:"


def _naive_oracle(text: str, keep: frozenset[str]) -> str:
    """What the picker must return or raise, by a plain line loop over the text."""
    lines = text.split("\n")
    content = [number for number, line in enumerate(lines) if line.strip(" \t\r")]
    try:
        for number in dict.fromkeys((content[0], content[-1])) if content else ():
            try:
                parse_lines(lines[number], frozenset())
            except ExpositionError as error:
                raise ExpositionError(number + 1, error.reason, lines[number]) from None
        kept: dict[str, list[object]] = {}
        for number, line in enumerate(lines):
            stripped = line.lstrip(" \t")
            if stripped.startswith("#"):  # a comment, or metadata, which the line parser checks
                try:
                    parse_lines(line, frozenset())
                except ExpositionError as error:
                    raise ExpositionError(number + 1, error.reason, line) from None
            for name in keep:
                rest = stripped[len(name) :]
                if stripped.startswith(name) and (not rest or rest[0] not in _NAME_CHARACTERS):
                    try:
                        (sample,) = parse_lines(line, keep).samples[name]
                    except ExpositionError as error:
                        raise ExpositionError(number + 1, error.reason, line) from None
                    kept.setdefault(name, []).append(sample)
        return repr({name: tuple(found) for name, found in kept.items()})
    except ExpositionError as error:
        return f"error at line {error.line_number}: {error.reason}"


def _picked(picker: SamplePicker, text: str) -> str:
    try:
        return repr(picker.pick(text).samples)
    except ExpositionError as error:
        problem = error
    assert "\n" not in str(problem)
    return f"error at line {problem.line_number}: {problem.reason}"


@given(data=st.data())
@budget(2.0)
def test_broken_expositions_pick_what_a_line_by_line_reading_of_the_kept_lines_finds(data: st.DataObject) -> None:
    text = broken_exposition(data, data.draw(st.sampled_from(TEXTS)))
    keep = data.draw(st.sampled_from([KEPT_SAMPLES, frozenset({"x", "x_count"})]))
    picker = SamplePicker(keep)
    assert _picked(picker, text) == _naive_oracle(text, keep)
    assert _picked(picker, text) == _naive_oracle(text, keep)  # with the label sets it remembered
