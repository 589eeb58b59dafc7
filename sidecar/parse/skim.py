"""Skims the families a filtered parse would skip, a whole family per regular-expression match. Pure: no I/O.

Most of a vLLM exposition is families the caller does not read (histogram buckets, HTTP and process metrics),
and checking their lines one by one in Python is most of a tick. prometheus_client writes one family at a
time: `# HELP`, `# TYPE name kind`, then its samples, histograms as buckets, `_count` and `_sum` per series,
summaries (without quantiles) as `_count` and `_sum`.
A family in exactly that shape, none of whose sample names is kept, is checked by one match in C: each of its
sample lines has the family's name (or its histogram suffix) followed by '{' or a space and ends in a digit,
NaN or Inf. Everything else (kept families, other shapes, anything unexpected) goes to the line parser, so
the result is always the line parser's: skimmed lines are ones it accepts without keeping anything, and this
module only records what it would have recorded for them (the family's type and sample names).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sidecar.model.exposition import Exposition, Sample

# Possessive, then a look back at the last character: the line is scanned once, with no backtracking state.
_SAMPLE_TAIL = r"[{ ][^\n]*+(?<=[0-9NnFf])\n"
# One match per family: the header, then a body whose shape the type decides (conditional groups), so the
# regex engine walks each family once. Plain kinds' samples carry the family's name itself (prometheus_client
# writes an info as a gauge); a histogram's series are buckets, _count, _sum; a summary without quantiles
# (all prometheus_client writes) is _count, _sum.
_FAMILY = re.compile(
    r"# HELP [^\n]*\n# TYPE (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*) "
    r"(?:(?P<histogram>histogram)|(?P<summary>summary)|(?P<plain>counter|gauge|untyped|unknown|info|stateset))\n"
    r"(?P<body>(?(histogram)"
    r"(?:(?:(?P=name)_bucket" + _SAMPLE_TAIL + r")+"
    r"(?P=name)_count" + _SAMPLE_TAIL + r"(?P=name)_sum" + _SAMPLE_TAIL + r")*"
    r"|(?(summary)"
    r"(?:(?P=name)_count" + _SAMPLE_TAIL + r"(?P=name)_sum" + _SAMPLE_TAIL + r")*"
    r"|(?:(?P=name)" + _SAMPLE_TAIL + r")*)))"
)  # fmt: skip
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_SUMMARY_SUFFIXES = ("_count", "_sum")
_NEXT_FAMILY = "\n# HELP "

LineParser = Callable[[str], Exposition]


def _family(text: str, match: re.Match[str], wanted: frozenset[str]) -> tuple[str, str, list[str], str]:
    """A recognised family's name and type, the sample names it holds, and its sample lines that are kept."""
    name, plain, histogram = match.group("name", "plain", "histogram")
    body_start, body_end = match.span("body")
    kind = plain if plain is not None else "histogram" if histogram is not None else "summary"
    if body_end == body_start:
        return name, kind, [], ""
    if plain is not None:
        return name, kind, [name], text[body_start:body_end] if name in wanted else ""
    names = [name + suffix for suffix in (_HISTOGRAM_SUFFIXES if histogram is not None else _SUMMARY_SUFFIXES)]
    kept = [sample_name for sample_name in names if sample_name in wanted]
    if not kept:
        return name, kind, names, ""
    if len(kept) == len(names) or kept[0] == names[0]:  # every line, or all the buckets: the whole body
        return name, kind, names, text[body_start:body_end]
    # Some of each series' lines are read (vLLM's iteration count is a histogram's _count): those lines alone,
    # found by name, since in a family matched this strictly no other line starts so.
    return name, kind, names, _lines_starting(text, tuple("\n" + sample_name for sample_name in kept), match)


def _lines_starting(text: str, prefixes: tuple[str, ...], match: re.Match[str]) -> str:
    """The lines of the matched family's body that start with one of `prefixes` ("\\n" + name), in order."""
    start, end = match.start("body") - 1, match.end("body")  # from the '\\n' before the body's first line
    found: list[tuple[int, int]] = []
    for prefix in prefixes:
        at = text.find(prefix, start, end)
        while at != -1:
            line_end = text.find("\n", at + 1, end)
            found.append((at + 1, line_end + 1))
            at = text.find(prefix, line_end, end)
    found.sort()
    return "".join(text[line_start:line_end] for line_start, line_end in found)


def skim_exposition(text: str, wanted: frozenset[str], parse_lines: LineParser) -> Exposition:
    """What `parse_lines(text)` returns, with the families that keep nothing skimmed instead of parsed.

    `parse_lines` is the line parser with the same filter. It gets, in text order, every part this module
    does not recognise, whole, and the sample lines of the recognised families that keep something, gathered
    into one text (their `# TYPE` is recorded here, in its place). Its errors propagate, numbered within the
    text it was given: see the caller.
    """
    samples: dict[str, list[Sample]] = {}
    types: dict[str, str] = {}
    seen: set[str] = set()
    pending = -1  # start of a part not recognised, waiting for the line parser; -1: none
    kept_lines: list[str] = []  # sample lines of recognised families that keep something

    def take(part: Exposition) -> None:
        for name, found in part.samples.items():
            samples.setdefault(name, []).extend(found)
        types.update(part.types)  # in order: a family typed twice keeps its last type, as in one pass
        seen.update(part.names_seen)

    def flush_pending(end: int) -> None:
        nonlocal pending
        if pending >= 0:
            take(parse_lines(text[pending:end]))
            pending = -1

    def flush_kept() -> None:
        if kept_lines:
            take(parse_lines("".join(kept_lines)))
            kept_lines.clear()

    position, length = 0, len(text)
    while position < length:
        match = _FAMILY.match(text, position)
        if match is None:
            # Not a family this module knows: the line parser takes it whole, up to the next family.
            following = text.find(_NEXT_FAMILY, position)
            if pending < 0:
                flush_kept()  # samples stay in text order
                pending = position
            position = length if following == -1 else following + 1
            continue
        flush_pending(position)
        name, kind, names, lines = _family(text, match, wanted)
        types[name] = kind
        seen.update(names)
        if lines:
            kept_lines.append(lines)
        position = match.end()
    flush_kept()
    flush_pending(length)
    return Exposition(
        samples={name: tuple(found) for name, found in samples.items()},
        types=types,
        names_seen=frozenset(seen),
    )
