"""Picks the sample lines a caller reads out of an exposition and parses only those, strictly. Pure: no I/O.

The daemon reads a few dozen lines of an exposition of hundreds of kilobytes (histogram buckets, HTTP and
process metrics, LoRA series make up the rest) every tick. `parse_exposition` checks the shape of every line,
which is most of a tick's CPU; a `SamplePicker` finds the wanted lines with one regular-expression search in C
(a line that starts, after optional blanks, with a wanted name, whatever follows it) and hands them, and
only them, to the strict line parser: every value the caller gets is checked exactly as a full parse checks it,
and a malformed wanted line is an `ExpositionError` numbered within the whole text.

The same search also finds every `# HELP` or `# TYPE` line the line parser refuses (a type Prometheus does not
know, metadata without a metric name: `REFUSED_METADATA`), so such a line fails the pick as it fails the full
parse; a valid one costs the search a few characters and Python nothing.

What it does not check, on purpose: the sample lines of families nobody reads. A malformed line there leaves
the wanted values as they are (Prometheus would drop the whole scrape; the sidecar keeps watching vLLM, and
`vllm-sidecar doctor`, which parses strictly, reports the line). What is not an exposition at all (an HTML
error page, JSON, binary) is still refused: the first and the last non-blank lines are checked as the line
parser checks any line, and a truncated body is the HTTP client's to refuse (Content-Length, chunked framing).

`names_seen` of the result holds the wanted and noticed names present, plus the first sample name found under
each noticed prefix: enough to answer "is there any `vllm:` family" and "is this name present" without
reading everything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sidecar.model.exposition import Exposition, Labels, Sample
from sidecar.parse.exposition import REFUSED_METADATA, ExpositionError, parse_lines, read_value

_BLANKS = "[ \t]*"
_NAME_ENDS = "(?![a-zA-Z0-9_:])"  # the whole name: a longer name that starts the same is another one
_BLANK_LINE = " \t\r"  # what the line parser skips as an empty line
# Label sets remembered between ticks; a server whose label values never repeat cannot grow this past the bound.
MAX_REMEMBERED_LABEL_SETS = 4096


class SamplePicker:
    """Built once for a set of names (the pattern is compiled then); `pick` runs every tick.

    It remembers the label sets of the lines it parsed (the text from the line's start to its last '}', which
    for a line the line parser accepted is its label set: a value and a timestamp hold no '}'). A line whose
    label text is one already read gets those labels and has only its value parsed, by the line parser's own
    value reader; any other line goes through the line parser whole. vLLM's label sets stay the same from one
    scrape to the next while the values move, and `vllm:cache_config_info` carries some forty labels.
    """

    def __init__(self, keep: Iterable[str], *, notice: Iterable[str] = (), notice_prefixes: Iterable[str] = ()) -> None:
        self.keep = frozenset(keep)
        self._notice = frozenset(notice) - self.keep
        alternatives = _alternation(self.keep | self._notice)
        # Metadata first: tried at a line's first non-blank character, it fails there at once unless that is '#'.
        line = f"{_BLANKS}(?:{REFUSED_METADATA}|(?P<name>{alternatives}){_NAME_ENDS})[^\n]*"
        self._first_line = re.compile(line)
        self._later_lines = re.compile(f"\n(?P<line>{line})")
        self._label_sets: dict[str, Labels] = {}
        # The first line of a prefix, matched at the text's start, else searched for after a '\n': a pattern that
        # starts with a literal is scanned for it in C, where `(?:^|\n)` made the engine try every character.
        self._prefixes = tuple(
            (
                re.compile(f"{_BLANKS}(?P<name>{re.escape(prefix)}[a-zA-Z0-9_:]*)"),
                re.compile(f"\n{_BLANKS}(?P<name>{re.escape(prefix)}[a-zA-Z0-9_:]*)"),
            )
            for prefix in notice_prefixes
        )

    def pick(self, text: str) -> Exposition:
        """The wanted samples of `text`, parsed strictly; raises `ExpositionError` (numbered in `text`)."""
        _check_outer_lines(text)
        seen: set[str] = set()
        samples: dict[str, list[Sample]] = {}
        for start, name, line in self._lines(text):
            if name is None:
                _check_metadata(text, start, line)
                continue
            seen.add(name)
            if name not in self.keep:
                continue
            try:
                sample = self._parse_line(name, line)
            except ExpositionError as error:
                raise ExpositionError(_line_number(text, start), error.reason, _line_at(text, start)) from None
            same_name = samples.get(name)
            if same_name is None:
                samples[name] = [sample]
            else:
                same_name.append(sample)
        for at_start, after_newline in self._prefixes:
            first_under_prefix = at_start.match(text) or after_newline.search(text)
            if first_under_prefix is not None:
                seen.add(first_under_prefix.group("name"))
        return Exposition(samples={name: tuple(found) for name, found in samples.items()}, names_seen=frozenset(seen))

    def _lines(self, text: str) -> list[tuple[int, str | None, str]]:
        """Where each line of a wanted or noticed name starts, its name, and the line (without its '\\n');
        and the same for each metadata line the line parser refuses, with None for a name."""
        first = self._first_line.match(text)
        found = [(0, first.group("name"), first.group(0))] if first is not None else []
        found += [(match.start("line"), match["name"], match["line"]) for match in self._later_lines.finditer(text)]
        return found

    def _parse_line(self, name: str, line: str) -> Sample:
        close = line.rfind("}")
        labels = self._label_sets.get(line[: close + 1]) if close != -1 else None
        if labels is not None:
            return Sample(name=name, labels=labels, value=read_value(line, close + 1, 1))
        (sample,) = parse_lines(line, (name,)).samples[name]
        if close != -1:
            if len(self._label_sets) >= MAX_REMEMBERED_LABEL_SETS:
                self._label_sets.clear()
            self._label_sets[line[: close + 1]] = sample.labels
        return sample


_END = ""  # the trie's key for "a name ends here" (no character of a name is empty)


def _alternation(names: Iterable[str]) -> str:
    """A pattern matching any of `names`, factored by common prefixes (a trie): `vllm:` is compared once per line,
    not once per wanted name, and most lines of an exposition start with it.

    It matches what the list of names, longest first, matched: where a name is also the start of longer ones,
    the longer are tried first (a greedy `?`), so the longest name that fits is the one found either way."""
    trie: dict[str, dict[str, Any]] = {}
    for name in names:
        node = trie
        for char in name:
            node = node.setdefault(char, {})
        node[_END] = {}
    return _render(trie) if trie else "(?!)"


def _render(node: dict[str, dict[str, Any]]) -> str:
    branches = [re.escape(char) + _render(child) for char, child in sorted(node.items()) if char != _END]
    if not branches:
        return ""
    pattern = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return f"(?:{pattern})?" if _END in node else pattern


def _check_metadata(text: str, start: int, line: str) -> None:
    """Raise the line parser's error for a metadata line the search found refused, numbered in `text`."""
    try:
        parse_lines(line, frozenset())
    except ExpositionError as error:
        raise ExpositionError(_line_number(text, start), error.reason, _line_at(text, start)) from None


def _check_outer_lines(text: str) -> None:
    """The first and the last lines that are not blank, checked as the line parser checks any line (keeping none)."""
    first = _first_content_line(text)
    if first is None:
        return  # empty, or blank lines only: an exposition with nothing in it
    last = _last_content_line(text)
    for start, end in (first, last) if last != first else (first,):
        try:
            parse_lines(text[start:end], frozenset())
        except ExpositionError as error:
            raise ExpositionError(_line_number(text, start), error.reason, _line_at(text, start)) from None


def _first_content_line(text: str) -> tuple[int, int] | None:
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end == -1 else end
        if text[start:end].strip(_BLANK_LINE):
            return start, end
        start = end + 1
    return None


def _last_content_line(text: str) -> tuple[int, int]:
    """Only called when `_first_content_line` found one, so there is one."""
    end = len(text)
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        if text[start:end].strip(_BLANK_LINE):
            return start, end
        end = start - 1
    return 0, 0


def _line_number(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _line_at(text: str, at: int) -> str:
    end = text.find("\n", at)
    line = text[at:] if end == -1 else text[at:end]
    return line[:-1] if line.endswith("\r") else line
