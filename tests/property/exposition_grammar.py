"""A hypothesis grammar for valid Prometheus text expositions (format 0.0.4), with the samples they hold.

Written from the format's documentation (prometheus.io, "Exposition formats"), not from the sidecar's
parser, so the two can disagree. What it generates, per the text format:

- metric names `[a-zA-Z_:][a-zA-Z0-9_:]*`, including vLLM's colon names (every family the sidecar reads);
- `# HELP` (docstring with `\\\\` and `\\n` escapes) and `# TYPE` lines (counter, gauge, histogram,
  summary, untyped) before a family's samples, at most one TYPE per family;
- histograms (`_bucket{le}`, `_sum`, `_count`), summaries (`{quantile}`, `_sum`, `_count`), counters with
  and without the `_total` suffix, and `_created` gauges as prometheus_client writes them;
- label sets with any Unicode value (`\\\\`, `\\"`, `\\n` escaped), blanks around every token, a trailing
  comma, `{}`; values as Go's ParseFloat reads them (integers, decimals, exponents, signs, `NaN`, `+Inf`,
  `-Inf`, `Inf`, `Infinity`); optional millisecond timestamps, unsigned and within int64 (Prometheus'
  lexer reads digits only);
- leading and trailing blanks on a line, blank lines, and free comments;
- a TYPE line's type after exactly one blank, ending the line (Prometheus reads the rest of the line as
  the type);
- of OpenMetrics, only a final `# EOF` (a comment to format 0.0.4): its type names (`unknown`, `info`,
  `stateset`, `gaugehistogram`) Prometheus refuses in a 0.0.4 TYPE line, and so does the parser. The
  parser is for format 0.0.4, which vLLM serves to a scraper that asks for no other (the source sends no
  Accept header); exemplars, units and OpenMetrics' own `_created` and `_total` rules are not claimed, so
  not generated.

What it leaves out, and why (the valid inputs the two Python parsers cannot agree on by design):
- label names starting with `__`: reserved for Prometheus; prometheus_client refuses them, Prometheus's own
  parser and the sidecar accept them;
- hexadecimal floats (`0x1p3`) and values out of float range (`1e400`, a 400-digit integer): Prometheus and
  the sidecar refuse both, prometheus_client reads the second (a long integer as an exact int); so
  mantissas have at most 12 digits and exponents at most 290;
- UTF-8 quoted metric names (`{"my.metric"}`): Prometheus 3's extension, not format 0.0.4.
"""

from __future__ import annotations

import operator
import re
import string
from dataclasses import dataclass

from hypothesis import strategies as st

from sidecar.parse.vllm import (
    CACHE_CONFIG,
    GENERATION_TOKENS,
    KV_USAGE,
    KV_USAGE_OLD,
    PREEMPTIONS,
    PREFIX_HIT_RATE_V0,
    PREFIX_HITS,
    PREFIX_HITS_OLD,
    PREFIX_QUERIES,
    PREFIX_QUERIES_OLD,
    PROMPT_TOKENS,
    RUNNING,
    SWAPPED,
    WAITING,
)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class GenSample:
    """One sample line as the format defines its meaning: the name written, the labels in order, the value."""

    name: str
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class GenExposition:
    text: str
    samples: tuple[GenSample, ...]  # in line order
    types: dict[str, str]  # family name -> declared type


# The families the sidecar reads, with their types, as vLLM (through prometheus_client) declares them.
VLLM_FAMILIES: tuple[tuple[str, str], ...] = (
    (KV_USAGE, "gauge"),
    (KV_USAGE_OLD, "gauge"),
    (RUNNING, "gauge"),
    (WAITING, "gauge"),
    (SWAPPED, "gauge"),
    (CACHE_CONFIG, "gauge"),
    (PREFIX_HIT_RATE_V0, "gauge"),
    (PREFIX_QUERIES, "counter"),
    (PREFIX_HITS, "counter"),
    (PREFIX_QUERIES_OLD, "counter"),
    (PREFIX_HITS_OLD, "counter"),
    (PREEMPTIONS, "counter"),
    (PROMPT_TOKENS, "counter"),
    (GENERATION_TOKENS, "counter"),
    ("vllm:iteration_tokens_total", "histogram"),  # the sidecar reads its _count
    ("vllm:e2e_request_latency_seconds", "histogram"),  # the rest: read by nobody, only shape-checked
    ("vllm:prompt_tokens_created", "gauge"),
    ("vllm:request_success_total", "counter"),
    ("vllm:time_per_output_token_seconds", "summary"),
    ("http_requests", "counter"),  # a counter without _total: prometheus_client renames its samples
    ("process_resident_memory_bytes", "gauge"),
)
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")

_LETTERS = string.ascii_letters + "_"
_DIGITS = string.digits
# Every strategy is built once here, from alphabets and lists of choices: a strategy built inside a draw is
# validated on every draw, and a regex strategy costs milliseconds each time.
metric_names = st.builds(operator.add, st.sampled_from(_LETTERS + ":"), st.text(_LETTERS + _DIGITS + ":", max_size=30))
label_names = st.builds(operator.add, st.sampled_from(_LETTERS), st.text(_LETTERS + _DIGITS, max_size=15)).filter(
    lambda name: not name.startswith("__") and name not in ("le", "quantile")
)
# Any Unicode, with the three characters that must be escaped (and the tokens around a value) often.
# codec="utf-8" everywhere: an exposition is UTF-8, so no lone surrogate (st.text only mostly leaves them out).
_unicode = st.characters(codec="utf-8")
label_values = st.text(st.one_of(st.sampled_from('\\"\n{},=# \t:'), _unicode), max_size=20)
help_texts = st.text(st.one_of(st.sampled_from('\\\n" '), _unicode), max_size=20)
blanks = st.sampled_from((" ", "\t", "  ", " \t"))
optional_blanks = st.sampled_from(("", "", "", " ", "\t", "  "))
_one_blank = st.sampled_from((" ", "\t"))
_SPECIAL_VALUES = ("NaN", "+Inf", "-Inf", "Inf", "nan", "+inf", "-Infinity", "Infinity")
_value_kinds = st.sampled_from(("repr", "int", "decimal", "exponent", "special"))
_finite_floats = st.floats(allow_nan=False, allow_infinity=False)
_signs = st.sampled_from(("", "+", "-"))
_integer_digits = st.text(_DIGITS, min_size=1, max_size=12)
_fraction_digits = st.text(_DIGITS, max_size=5)
_exponent_markers = st.sampled_from(("e", "E", "e+", "e-", "E-"))
_exponents = st.integers(0, 290)  # with 12 digits, under 1e303: in float range
_bounds = st.lists(st.floats(-1e6, 1e6), max_size=3, unique=True)
_quantiles = st.lists(st.floats(0, 1), max_size=3, unique=True)
timestamps = st.integers(0, 2**63 - 1).map(str)  # Prometheus reads digits, no sign, into an int64
_label_name_lists = st.lists(label_names, max_size=4, unique=True)


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def written_float(draw: st.DrawFn) -> tuple[str, float]:
    """A value as an exposition writes it, and the float it means."""
    kind = draw(_value_kinds)
    if kind == "special":
        text = draw(st.sampled_from(_SPECIAL_VALUES))
        return text, float(text)
    if kind == "repr":
        value = draw(_finite_floats)
        return repr(value), value
    sign, digits = draw(_signs), draw(_integer_digits)
    if kind == "int":
        text = sign + digits
    elif kind == "decimal":
        text = sign + (digits + "." + draw(_fraction_digits) if draw(st.booleans()) else "." + digits)
    else:
        text = sign + digits + draw(_exponent_markers) + str(draw(_exponents))
    return text, float(text)


def label_set(draw: st.DrawFn) -> Labels:
    return tuple((name, draw(label_values)) for name in draw(_label_name_lists))


def with_label(draw: st.DrawFn, labels: Labels, name: str, value: str) -> Labels:
    """`labels` with one more pair anywhere in the set (the format does not order labels)."""
    at = draw(st.integers(0, len(labels)))
    return (*labels[:at], (name, value), *labels[at:])


def sample_line(draw: st.DrawFn, name: str, labels: Labels) -> tuple[str, GenSample]:
    """One sample line with free blanks, escaped label values and maybe a timestamp."""
    value_text, value = written_float(draw)
    line = draw(optional_blanks) + name
    if bool(labels) or draw(st.booleans()):  # `{}` is a valid empty label set
        parts = [
            f'{draw(optional_blanks)}{label}{draw(optional_blanks)}={draw(optional_blanks)}"{escape_label_value(v)}"'
            for label, v in labels
        ]
        trailing_comma = "," if bool(parts) and draw(st.booleans()) else ""
        line += draw(optional_blanks) + "{" + ",".join(parts) + trailing_comma + draw(optional_blanks) + "}"
        line += draw(optional_blanks)
    else:
        line += draw(blanks)
    line += value_text
    if draw(st.booleans()):
        line += draw(blanks) + draw(timestamps)
    line += draw(optional_blanks)
    return line, GenSample(name=name, labels=labels, value=value)


def sample_names(name: str, kind: str) -> tuple[str, ...]:
    """Every sample name a family of `kind` writes."""
    if kind == "histogram":
        return (name + "_bucket", name + "_sum", name + "_count")
    if kind == "summary":
        return (name, name + "_sum", name + "_count")
    return (name,)


def family(draw: st.DrawFn, name: str, kind: str) -> tuple[list[str], list[GenSample], str | None]:
    """The lines of one family: HELP and TYPE (each optional), then its samples. Returns the declared type."""
    lines: list[str] = []
    declared: str | None = None
    if draw(st.booleans()):
        lines.append(f"#{draw(blanks)}HELP{draw(blanks)}{name} {escape_help(draw(help_texts))}")
    if kind != "untyped" or draw(st.booleans()):
        # One blank before the type, which ends the line: Prometheus reads the rest of the line as the type.
        lines.append(f"{draw(optional_blanks)}#{draw(blanks)}TYPE{draw(blanks)}{name}{draw(_one_blank)}{kind}")
        declared = kind
    samples: list[GenSample] = []

    def add(sample_name: str, labels: Labels) -> None:
        line, sample = sample_line(draw, sample_name, labels)
        lines.append(line)
        samples.append(sample)

    least = 1 if kind in ("counter", "gauge", "untyped") else 0
    for _ in range(draw(st.integers(least, 3))):
        labels = label_set(draw)
        if kind == "histogram":
            for bound in [*(repr(b) for b in sorted(draw(_bounds))), "+Inf"]:
                add(name + "_bucket", with_label(draw, labels, "le", bound))
        if kind == "summary":
            for quantile in sorted(draw(_quantiles)):
                add(name, with_label(draw, labels, "quantile", repr(quantile)))
        for child in ("_sum", "_count") if kind in ("histogram", "summary") else ("",):
            add(name + child, labels)
    return lines, samples, declared


# A comment is HELP or TYPE only when its first blank-separated token says so; blanks are space and tab.
# prometheus_client also splits on \r, \v and \f (string.whitespace), so those are kept out of a comment's
# first token: there the reference itself departs from the format.
free_comments = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=20).filter(
    lambda text: re.split(r"[ \t\r\v\f]+", text.strip(" \t\r\v\f"))[0] not in ("HELP", "TYPE")
)


_family_choices = st.one_of(st.sampled_from(VLLM_FAMILIES), st.tuples(metric_names, st.sampled_from(TYPES)))
_blank_lines = st.sampled_from(("", " ", "\t"))
_one_in_five = st.integers(0, 4)


@st.composite
def expositions(draw: st.DrawFn, *, max_families: int = 6) -> GenExposition:
    """A whole valid exposition: families with distinct sample names, blank lines and comments between."""
    chosen: list[tuple[str, str]] = []
    taken: set[str] = set()
    for name, kind in draw(st.lists(_family_choices, max_size=max_families)):
        names = {name, *sample_names(name, kind)}
        if names & taken:
            continue  # one family per sample name, as the format requires
        taken |= names
        chosen.append((name, kind))
    lines: list[str] = []
    samples: list[GenSample] = []
    types: dict[str, str] = {}
    for name, kind in chosen:
        if draw(st.booleans()):
            lines.append(draw(_blank_lines))
        if draw(_one_in_five) == 0:
            lines.append("#" + draw(free_comments))
        family_lines, family_samples, declared = family(draw, name, kind)
        lines += family_lines
        samples += family_samples
        if declared is not None:
            types[name] = declared
    if draw(st.booleans()):
        lines.append("# EOF")  # OpenMetrics' last line; a comment to format 0.0.4
    return GenExposition(text="".join(line + "\n" for line in lines), samples=tuple(samples), types=types)
