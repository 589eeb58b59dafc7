"""A fast parser for the Prometheus text exposition format (0.0.4), as vLLM serves it. Pure: no I/O.

It runs every tick on expositions of hundreds of kilobytes, most of which (histogram buckets, HTTP and
process metrics) the sidecar never reads. So it takes the set of sample names it should keep and only
checks the shape of every other line, which is several times cheaper than a full parse. With no filter it
parses everything; the tests compare that full parse with `prometheus_client.parser` on real captures.

Like Prometheus, it rejects the whole exposition on the first malformed line it parses: a half-read
scrape must never pass for a whole one.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from sidecar.model.exposition import Exposition, Labels, Sample
from sidecar.parse.skim import skim_exposition

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
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
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_KNOWN_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown"}
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
    (HTML error pages, binary data) is rejected even when nothing in it would be kept. With a filter, the
    families that keep nothing are skimmed a family at a time (sidecar.parse.skim); the result is the same.
    """
    if keep is None:
        return parse_lines(text, None)
    wanted = frozenset(keep)
    try:
        return skim_exposition(text, wanted, lambda part: parse_lines(part, wanted))
    except ExpositionError:
        # The skim parsed that part alone, so the line number is the part's: parse the whole text for the
        # error numbered within it (and should the whole text parse after all, that is the answer).
        return parse_lines(text, wanted)


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
    parts = line.split(None, 3)
    if len(parts) >= 2 and parts[1] == "TYPE":
        if len(parts) != 4:
            raise ExpositionError(line_number, "a TYPE line needs a metric name and a type", line)
        kind = parts[3].strip()
        if kind not in _KNOWN_TYPES:
            raise ExpositionError(line_number, f"unknown metric type {kind!r}", line)
        types[parts[2]] = kind


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
        return tuple(_PLAIN_LABEL.findall(plain.group(1))), plain.end()
    labels: list[tuple[str, str]] = []
    pos = at + 1
    length = len(line)
    while True:
        while pos < length and line[pos] in " \t":
            pos += 1
        if pos >= length:
            raise ExpositionError(line_number, "unterminated label set", line)
        if line[pos] == "}":
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
        elif pos >= length or line[pos] != "}":
            raise ExpositionError(line_number, "labels must be separated by ','", line)


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
    fields = line[at:].split()
    if not fields or len(fields) > 2:
        raise ExpositionError(line_number, "a sample needs a value and at most a timestamp", line)
    try:
        value = float(fields[0])
    except ValueError:
        value = None
    # Python also reads "1_000"; the exposition format does not.
    if value is None or "_" in fields[0]:
        raise ExpositionError(line_number, f"invalid sample value {fields[0]!r}", line)
    if len(fields) == 2:
        try:
            int(fields[1])
        except ValueError:
            raise ExpositionError(line_number, f"invalid timestamp {fields[1]!r}", line) from None
    return value
