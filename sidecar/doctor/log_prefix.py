"""Each line's prefix, learned from the log itself: what a logger, a launcher or a paste put before the message. Pure.

Whatever prints vLLM's output adds its own prefix to each line: vLLM's logger (`ERROR 03-20 17:39:14
[core.py:1100]`), its multiprocess decorator (`(EngineCore_DP0 pid=43)`), a launcher (`2025-05-01 12:00:00 |
ERROR | stderr |`), docker compose, journald, `kubectl logs --timestamps`, a markdown quote. No list of known
prefixes is kept: a line's head is read as a run of prefix-shaped tokens (timestamps, levels, bracketed groups,
separators, `name[pid]:` tags), and a head counts as a prefix only when its shape (digits masked, levels and
group contents erased) starts enough lines of this log. `22.5 GiB KV cache is needed` is then a message that a
terminal wrapped, not a line with a `22.5` prefix.

A launcher's own tag that no token shape describes (DJL Serving's `PyProcess W-252-model-stderr:`, a job's
`serve.err:`) is learned from its words: the same words, ending like a tag, start most lines (three in five), and on
some line another prefix or a traceback's line follows them (a message many lines start with, `Avg prompt throughput:`,
is followed by neither). The prefix after the tag is learned again, as on a line of its own.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_LEVELS = (
    "INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL|TRACE|NOTICE|Info|Warning|Warn|Error|Debug|Critical|"
    "info|warning|warn|error|debug|stdout|stderr"
)
# One token of a line's head, each followed by whitespace (or the end). The group names are the token's class.
_HEAD_TOKEN = re.compile(
    r"(?P<group>\([^()\n]{1,160}\)|\[[^\[\]\n]{1,160}\]|<[^<>\n]{1,60}>):?"
    rf"|(?P<level>(?:{_LEVELS})):?"
    rf"|(?P<month>(?:{_MONTHS}))"
    r"|(?P<tag>(?:[\w.\-]+\s+)?[\w.\-/@]+\[\d+\]:|[\w.\-/@]+(?=\s+\|))"
    r"|(?P<where>[\w.\-/]+:\d+\])"  # V0's and glog's `engine.py:135]`
    r"|(?P<time>\d[\d\-:/.,T]*(?:Z|[+-]\d\d:?\d\d)?)"
    r"|(?P<sep>[|>»:*\-\u2502\u2503\u258c\u258d\u258e])"  # quote bars a rendered page's copy keeps: │ ┃ ▌ ▍ ▎
)
_SPACE = re.compile(r"[ \t]+")
_MAX_HEAD_TOKENS = 14
_MIN_PREFIX_LINES = 2  # a head shape must start at least this many lines ...
_MIN_PREFIX_SHARE = 0.05  # ... and this share of the non-empty lines to count as the log's prefix
_MIN_TAGGED_LINES = 3  # a launcher's tag is learned from at least this many lines ...
_TAGGED_SHARE = 0.6  # ... that start with it, of the non-empty lines (a paste adds a command, a header, a cut line)
_MAX_TAG_WORDS = 4
_TAG_END = (":", "|", "]", ">")
# What follows a launcher's tag on some line: a traceback's or an exception's line, or a prefix of its own (a level,
# a bracketed or parenthesised group, a `file.py:N]`, a clock time or a date: not a bare number, which a message has).
# Not an indented line alone: a progress bar (`Loading safetensors checkpoint shards:   0% Completed`) is indented
# after words many lines start with.
_AFTER_TAG = re.compile(
    rf'[ \t]*(?:File "|Traceback \(most recent|(?:{_LEVELS})\b|[(\[<]|[\w.\-/]+:\d+\]|\d+[:\-]\d'
    r"|[\w.]*(?:Error|Exception)\b)"  # an exception's line: `ValueError: ...`, `torch.OutOfMemoryError: ...`
)
_MAX_TAGS = 3  # launchers inside launchers: a job's tag, then DJL's, then vLLM's own prefix

Head = list[tuple[str, int]]


def line_prefixes(lines: list[str]) -> tuple[list[str], list[int]]:
    """Each line's learned prefix ("" for none), and the column its message starts at after its head (0 for a
    line without one): where a hanging indent puts the rest of a wrapped message."""
    heads = [_head(line) for line in lines]
    prefixes = _prefixes(lines, heads)
    for _ in range(_MAX_TAGS):
        tag = _shared_tag([line[len(prefix) :] for line, prefix in zip(lines, prefixes, strict=True) if line.strip()])
        if tag is None:
            break
        tagged = [_after_tag(line[len(prefix) :], tag) for line, prefix in zip(lines, prefixes, strict=True)]
        rests = [
            line[len(prefix) + len(found) :] if found else ""
            for line, prefix, found in zip(lines, prefixes, tagged, strict=True)
        ]
        inner = _prefixes(rests, [_head(rest) for rest in rests])
        prefixes = [
            prefix + found + inside if found else prefix
            for prefix, found, inside in zip(prefixes, tagged, inner, strict=True)
        ]
    columns = [
        max(len(prefix), head[-1][1] if head else 0) if prefix or head else 0
        for prefix, head in zip(prefixes, heads, strict=True)
    ]
    return prefixes, columns


def _prefixes(lines: list[str], heads: list[Head]) -> list[str]:
    learned = _learned_shapes(heads, sum(1 for line in lines if line.strip()))
    return [_learned_prefix(line, head, learned) for line, head in zip(lines, heads, strict=True)]


def _head(line: str) -> Head:
    """The prefix-shaped tokens a line starts with: (shape, end offset including the one space after it)."""
    tokens: Head = []
    at = 0
    while len(tokens) < _MAX_HEAD_TOKENS:
        match = _HEAD_TOKEN.match(line, at)
        if match is None:
            break
        end = match.end()
        space = _SPACE.match(line, end)
        if space is None and end < len(line):
            break  # a token must stand alone: `ERROR:` yes, `Error(` or `1048576),` no
        tokens.append((_shape(match), end + (1 if space is not None else 0)))
        at = space.end() if space is not None else end
    return tokens


def _shape(match: re.Match[str]) -> str:
    kind = match.lastgroup or ""
    text = match.group(0)
    if kind == "group":
        return text[0] + text[-1] if text[-1] != ":" else text[0] + text[-2] + ":"
    if kind == "time":
        return re.sub(r"\d+", "9", text)
    if kind == "sep":
        return text
    return kind  # level, month, tag, where: their words vary line to line


def _learned_shapes(heads: list[Head], non_empty: int) -> set[tuple[str, ...]]:
    """Head shapes (each leading run of tokens) that start enough lines of this log to be its prefix."""
    counts: Counter[tuple[str, ...]] = Counter()
    for head in heads:
        shapes = tuple(shape for shape, _ in head)
        counts.update(shapes[: n + 1] for n in range(len(shapes)))
    lines = sum(1 for head in heads if head) or 1
    # A one-line paste has nothing to compare with: its own head is its prefix. One head among several lines is
    # no prefix (`69.27 MiB is reserved ...`, a wrapped message's number).
    needed = max(min(_MIN_PREFIX_LINES, max(non_empty, 1)), math.ceil(_MIN_PREFIX_SHARE * lines))
    return {shapes for shapes, count in counts.items() if count >= needed}


def _learned_prefix(line: str, head: Head, learned: set[tuple[str, ...]]) -> str:
    shapes = tuple(shape for shape, _ in head)
    for n in range(len(head), 0, -1):
        if shapes[:n] in learned:
            return line[: head[n - 1][1]]
    return ""


def _shared_tag(rests: list[str]) -> tuple[str, ...] | None:
    """The words of a launcher's tag: the shortest run of up to four leading words that ends like a tag, starts
    most lines' rests and is followed by a prefix or a traceback's line on some line; None when none is."""
    # From three lines on, three in five must start with it; a shorter paste has nothing to outvote: all of them.
    needed = (
        max(_MIN_TAGGED_LINES, math.ceil(_TAGGED_SHARE * len(rests))) if len(rests) >= _MIN_TAGGED_LINES else len(rests)
    )
    if not rests:
        return None
    runs: Counter[tuple[str, ...]] = Counter()
    for rest in rests:
        words = tuple(_SPACE.split(rest.strip(" \t"), maxsplit=_MAX_TAG_WORDS)[:_MAX_TAG_WORDS])
        runs.update(words[:count] for count in range(1, len(words) + 1) if words[count - 1].endswith(_TAG_END))
    for run in sorted((run for run, count in runs.items() if count >= needed), key=len):
        if any(_AFTER_TAG.match(rest[len(found) :]) for rest in rests if (found := _after_tag(rest, run))):
            return run
    return None


def _after_tag(rest: str, tag: tuple[str, ...]) -> str:
    """The tag as `rest` starts with it, with the whitespace around it ("" when it does not)."""
    pattern = r"[ \t]*" + r"[ \t]+".join(re.escape(word) for word in tag) + r"(?:[ \t]|$)"
    found = re.match(pattern, rest)
    return found.group(0) if found is not None else ""
