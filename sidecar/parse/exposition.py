"""A fast parser for the Prometheus text exposition format (0.0.4), as vLLM serves it. Pure: no I/O.

It can take the set of sample names it should keep and only check the shape of every other line, which
is several times cheaper than a full parse (the doctor reads so; the tick and the load tester read through
`sidecar.parse.pick`, which hands this module the lines it wants). With no filter it parses everything; the
tests compare that full parse with `prometheus_client.parser` on real captures, and with what Prometheus'
own parser does on the published conformance cases (tests/unit/exposition_conformance_cases.json).

Like Prometheus, it rejects the whole exposition on the first malformed line it parses: a half-read
scrape must never pass for a whole one. Where the format is loose, it reads what Prometheus' scrape parser
(model/textparse/promparse.go) reads: TYPE takes the five types of format 0.0.4, a HELP or TYPE line names
a metric, a value is what Go's ParseFloat reads in decimal (ASCII, no '_', no signed NaN, nothing out of
float range), a timestamp is ASCII digits within int64, a label name appears once in a sample.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import NoReturn

from sidecar.model.exposition import Exposition, Labels, Sample

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# "# HELP " and "# TYPE " (blanks are space and tab): metadata, which must name a metric; "#HELP", "# HELP"
# alone or "# HELPER" are comments, as in Prometheus' lexer.
_METADATA = re.compile(r"#[ \t]+(HELP|TYPE)[ \t]+")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
# A label set without blanks or escapes, as prometheus_client writes it; read by the C regex engine in one go.
_PLAIN_LABELS = re.compile(r'\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*",)*[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"),?\}')
_PLAIN_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# One C-level match per line: the name, then '{' or whitespace (checked here, so the line has a rest).
# Blanks may also stand between the name and its '{' (group 2), as the format allows between any tokens.
_NAME_THEN_SEPARATOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:[ \t]*(\{)|[ \t])")
# How a value (or timestamp) can end: a digit, "5." , NaN, Inf, Infinity: what Go's ParseFloat, which the format
# names, reads.
_VALUE_END = "0123456789.NnFfYy"
_VALUE_END_SET = frozenset(_VALUE_END)
# A value, then maybe a timestamp (ASCII digits: Prometheus' lexer takes no sign), blanks around either.
_VALUE_AND_TIMESTAMP = re.compile(r"[ \t]*([^ \t]+)(?:[ \t]+([0-9]+))?[ \t]*")
_MAX_TIMESTAMP = 2**63 - 1  # Go's ParseInt into an int64
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
# Format 0.0.4's types. OpenMetrics adds info, stateset, gaugehistogram and unknown; Prometheus refuses
# them in a 0.0.4 exposition ("invalid metric type"), and so does this parser.
_KNOWN_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
# A regular expression that matches, at a line's first non-blank character, exactly the HELP and TYPE lines
# `_read_comment` refuses (the picker finds them with it, without a Python step per valid line): HELP or TYPE
# without a metric name, or a TYPE not followed by one blank and a known type up to the line's end.
REFUSED_METADATA = (
    r"#[ \t]+(?:HELP[ \t]++(?![a-zA-Z_:])"
    r"|TYPE[ \t]++(?![a-zA-Z_:][a-zA-Z0-9_:]*[ \t](?:" + "|".join(sorted(_KNOWN_TYPES)) + r")\r?(?:\n|\Z)))"
)


class ExpositionError(ValueError):
    """The text is not a valid Prometheus text exposition; the message names the line."""

    def __init__(self, line_number: int, reason: str, line: str) -> None:
        excerpt = line if len(line) <= 80 else line[:77] + "..."
        super().__init__(f"line {line_number}: {reason}: {excerpt!r}")
        self.line_number = line_number
        self.reason = reason


def parse_exposition(text: str, keep: Collection[str] | None = None) -> Exposition:
    """Parse `text`; keep only samples whose name is in `keep` (all when `keep` is None).

    Every sample line is checked at least for a valid metric name followed by a separator, so garbage
    (HTML error pages, binary data) is rejected even when nothing in it would be kept.
    """
    return parse_lines(text, None if keep is None else frozenset(keep))


def parse_lines(text: str, keep: Collection[str] | None) -> Exposition:
    """The line parser: every line of `text` in order; the samples named in `keep` (all when None) parsed."""
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    seen: set[str] = set()
    keep_all = keep is None
    wanted = frozenset(keep) if keep is not None else frozenset()
    for line_number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line:
            continue
        first = line[0]
        if first in " \t":
            line = line.lstrip(" \t")  # the format ignores leading blanks, on comment lines too
            if not line or line.isspace():
                continue
            first = line[0]
        if first == "#":
            _read_comment(line, line_number, types)
            continue
        name, rest_at = _read_name(line, line_number)
        seen.add(name)
        if not keep_all and name not in wanted:
            # O(1) shape check of the rest: see _VALUE_END.
            if line[-1] not in _VALUE_END and line.rstrip()[-1:] not in _VALUE_END_SET:
                raise ExpositionError(line_number, "a sample line must end with a value", line)
            continue
        labels, value_at = _read_labels(line, rest_at, line_number) if line[rest_at] == "{" else ((), rest_at)
        value = read_value(line, value_at, line_number)
        bucket = samples.get(name)
        if bucket is None:
            samples[name] = [Sample(name=name, labels=labels, value=value)]
        else:
            bucket.append(Sample(name=name, labels=labels, value=value))
    return Exposition(
        samples={name: tuple(found) for name, found in samples.items()},
        types=types,
        names_seen=frozenset(seen),
    )


def _read_comment(line: str, line_number: int, types: dict[str, str]) -> None:
    metadata = _METADATA.match(line)
    if metadata is None:
        return  # a comment
    keyword = metadata.group(1)
    name = _METRIC_NAME.match(line, metadata.end())
    if name is None:
        raise ExpositionError(line_number, f"a {keyword} line needs a metric name", line)
    if keyword == "HELP":
        return  # the docstring is free text
    # As Prometheus reads it: one blank after the name, then the type, exactly (no further blanks).
    rest = line[name.end() :]
    if not rest[1:] or rest[0] not in " \t":
        raise ExpositionError(line_number, "a TYPE line needs a metric name and a type", line)
    kind = rest[1:]
    if kind not in _KNOWN_TYPES:
        raise ExpositionError(line_number, f"unknown metric type {kind!r}", line)
    types[name.group()] = kind


def _read_name(line: str, line_number: int) -> tuple[str, int]:
    """Return the metric name and the index of its label set's '{', else of the whitespace after the name."""
    match = _NAME_THEN_SEPARATOR.match(line)
    if match is None:
        raise ExpositionError(line_number, "a sample line needs a valid metric name, then labels or a value", line)
    brace = match.start(2)
    return match.group(1), brace if brace != -1 else match.end(1)


def _read_labels(line: str, at: int, line_number: int) -> tuple[Labels, int]:  # noqa: PLR0912 - one branch per grammar rule reads best as a flat scanner
    """Read `{name="value",...}` starting at the '{'; return the labels and the index after the '}'."""
    plain = _PLAIN_LABELS.match(line, at)
    if plain is not None:
        # What the scanner below reads from such a set, label for label (vLLM's cache_config_info has 38).
        found = _PLAIN_LABEL.findall(plain.group(1))
        _check_distinct(found, line, line_number)
        return tuple(found), plain.end()
    labels: list[tuple[str, str]] = []
    pos = at + 1
    length = len(line)
    while True:
        while pos < length and line[pos] in " \t":
            pos += 1
        if pos >= length:
            raise ExpositionError(line_number, "unterminated label set", line)
        if line[pos] == "}":
            _check_distinct(labels, line, line_number)
            return tuple(labels), pos + 1
        equals = line.find("=", pos)
        if equals == -1:
            raise ExpositionError(line_number, "a label needs '=' and a quoted value", line)
        label_name = line[pos:equals].strip()
        if _LABEL_NAME.fullmatch(label_name) is None:
            raise ExpositionError(line_number, f"invalid label name {label_name!r}", line)
        quote = equals + 1
        while quote < length and line[quote] in " \t":
            quote += 1
        if quote >= length or line[quote] != '"':
            raise ExpositionError(line_number, f"the value of label {label_name!r} must be quoted", line)
        close = line.find('"', quote + 1)
        if close == -1:
            raise ExpositionError(line_number, f"unterminated value of label {label_name!r}", line)
        if line.find("\\", quote + 1, close) == -1:
            label_value = line[quote + 1 : close]
        else:
            label_value, close = _read_escaped(line, quote + 1, line_number, label_name)
        labels.append((label_name, label_value))
        pos = close + 1
        while pos < length and line[pos] in " \t":
            pos += 1
        if pos < length and line[pos] == ",":
            pos += 1
        elif pos >= length or (line[pos] != "}" and line[pos] not in _LABEL_NAME_START):
            # Prometheus reads `{a="1" b="2"}` as two labels (promparse.go: "this allows spaces between label
            # names ..."), so a scrape it takes is not refused here; anything else must be ',' or '}'.
            raise ExpositionError(line_number, "labels must be separated by ','", line)


def _check_distinct(labels: list[tuple[str, str]], line: str, line_number: int) -> None:
    """A label name appears once in a sample, and `__name__` not at all (the metric name is that label)."""
    names = {name for name, _ in labels}
    if len(names) != len(labels) or "__name__" in names:
        seen = {"__name__"}
        for name, _ in labels:
            if name in seen:
                raise ExpositionError(line_number, f"label name {name!r} is not unique", line)
            seen.add(name)


def _read_escaped(line: str, start: int, line_number: int, label_name: str) -> tuple[str, int]:
    """Read a label value with backslash escapes; return it and the index of its closing quote."""
    chars: list[str] = []
    pos = start
    length = len(line)
    while pos < length:
        char = line[pos]
        if char == '"':
            return "".join(chars), pos
        if char == "\\":
            if pos + 1 >= length:
                break
            escaped = line[pos + 1]
            # Prometheus keeps an unknown escape as the backslash plus the character.
            chars.append(_ESCAPES.get(escaped, "\\" + escaped))
            pos += 2
            continue
        chars.append(char)
        pos += 1
    raise ExpositionError(line_number, f"unterminated value of label {label_name!r}", line)


def read_value(line: str, at: int, line_number: int) -> float:
    """The value of a sample line whose value (and optional timestamp) starts at `at`; raises ExpositionError."""
    found = _VALUE_AND_TIMESTAMP.fullmatch(line, at)
    if found is None:
        _refuse_value_part(line, at, line_number)
    text, timestamp = found.group(1, 2)
    try:
        value = float(text)
    except ValueError:
        raise ExpositionError(line_number, f"invalid sample value {text!r}", line) from None
    # Python's float() reads more than Go's ParseFloat, which the format names: "1_000", other scripts'
    # digits, a signed NaN, and a number beyond float range (as infinity, where Go fails).
    if not text.isascii() or "_" in text or (math.isnan(value) and text[0] in "+-"):
        raise ExpositionError(line_number, f"invalid sample value {text!r}", line)
    if math.isinf(value) and text.lstrip("+-")[:1] not in ("i", "I"):
        raise ExpositionError(line_number, f"sample value {text!r} is out of range", line)
    if timestamp is not None and int(timestamp) > _MAX_TIMESTAMP:
        raise ExpositionError(line_number, f"timestamp {timestamp!r} is out of range", line)
    return value


def _refuse_value_part(line: str, at: int, line_number: int) -> NoReturn:
    """Why the rest of a sample line is not a value and an optional timestamp (the error path, not hot)."""
    fields = [field for field in re.split("[ \t]+", line[at:]) if field]
    if not fields or len(fields) > 2:
        raise ExpositionError(line_number, "a sample needs a value and at most a timestamp", line)
    raise ExpositionError(line_number, f"invalid timestamp {fields[1]!r}", line)
