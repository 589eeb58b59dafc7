"""A log as records: each line's prefix, learned from the log itself, and messages put back together. Pure.

Each line's prefix (a logger's, a launcher's, a paste's) is learned from the log itself (`log_prefix`).

A line continues the record before it when it does not start a record of its own: it has no learned prefix,
and it is neither indented (a traceback's code), nor a traceback or exception line, nor a progress bar, nor led
by a clock time (a record whose prefix shape is this log's only one of it). An indented line does continue a record
when its indentation is exactly where the record's message starts after its head: a hanging indent, as a
logger or an author wraps a long message under itself. The
continuation is appended to the record (with no space where a word was cut, `KV cach` + `e is needed`), so a
message wrapped at any point reads as one line. Message patterns are written whitespace-tolerant (`loose`)
for wraps that fell on a space the paste dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.doctor.log_prefix import line_prefixes

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[\d;]*m")
_QUOTE_BAR = re.compile(r"[ \t]*(?:[|>\u2502\u2503\u258c\u258d\u258e][ \t]*)+")
_PREFIXED_LOG_SHARE = 0.5  # a log where at least this share of lines carry a prefix is a prefixed log
_WRAPPED_AT = 60  # a line this long that no sentence's end closes was wrapped
_MAX_RECORD_CHARS = 65536  # a wrapped message is never longer: past it, a run of loose lines starts a new record
# A line that starts a record by its own shape, whatever prefix it has or lacks.
_RECORD_START = re.compile(
    r"""^(?:\s                                  # indented: a traceback's code, a caret line, a continuation
         | Traceback\ \(most\ recent\ call\ last\)
         | File\ "
         | During\ handling\ of\ the\ above\ exception
         | The\ above\ exception\ was
         | [\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault)\b  # an exception line
         | .{0,80}?\d+%\|                        # a progress bar
         | (?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\ \d\d-\d\d  # vLLM's own logger, even on a line of its own
         | (?:\d{4}-\d\d-\d\d[T\ ])?\d\d:\d\d:\d\d\b  # a clock time: a record of a shape seen once (no wrap)
         | Killed\s*$                           # a shell's word for a process SIGKILL ended
         | \[rank\d+\]:                          # torch.distributed's rank prefix on a line of its own
         | \([^()\n]{1,60}\bpid=\d+[^()\n]{0,60}\)\  # a vLLM process's prefix: (APIServer pid=2), (Worker_TP0 pid=9)
         | \[?[IWEF]\d{3,4}\ \d\d:\d\d:\d\d        # c10's and glog's head: [W318 13:41:30.26 ...]
         )""",
    re.VERBOSE,
)
_PROCESS = re.compile(r"\([^()]*\bpid=\d+[^()]*\)|\[rank\d+\]")
# `Worker_TP3`: an underscore is a word character, so no \b before TP.
_TP_RANK = re.compile(r"\brank[=_ ]?(\d+)|\[rank(\d+)\]|(?<![A-Za-z])TP(\d+)\b", re.IGNORECASE)
_RANK = re.compile(r"\brank[=_ ]?(\d+)|\[rank(\d+)\]|(?<![A-Za-z])TP(\d+)\b|(?<![A-Za-z])DP(\d+)\b", re.IGNORECASE)
# A worker process of a multi-GPU executor (V1's `Worker_TP0`, V0's `VllmWorkerProcess`, which serves ranks 1 on):
# more than one GPU holds the model even where only one rank speaks. Not Ray's wrapper, which also runs one GPU.
_PARALLEL_WORKER = re.compile(r"Worker_[TP]P\d|VllmWorker")
EXCEPTION_LINE = re.compile(r"\s*[\w.]*(?:Error|Exception): \S")  # a raised exception's line, message and all
_WORKER_AT_START = re.compile(r"\(Worker_TP(\d+)\b[^()]*\)")


@dataclass(frozen=True, slots=True)
class Record:
    """One logical line of the log: its first line as printed, with the payloads of the lines that continued it."""

    text: str
    prefix: str  # the learned prefix of its first line, "" when it has none

    @property
    def payload(self) -> str:
        return self.text[len(self.prefix) :]

    @property
    def process(self) -> str:
        """The process the prefix names (`(EngineCore_DP0 pid=43)`, `[rank1]`), "" when it names none: the lines
        of one traceback share it when several processes print at once."""
        match = _PROCESS.search(self.prefix)
        return match.group(0) if match is not None else ""

    @property
    def parallel_worker(self) -> bool:
        return _PARALLEL_WORKER.search(self.prefix) is not None

    @property
    def tp_rank(self) -> int | None:
        """The rank among the GPUs that hold one copy of the model (not a data-parallel engine's index); the
        highest where a line names several (two workers' prefixes on one line: `(Worker_TP1 ..) (Worker_TP3 ..)`)."""
        ranks = [
            int(next(group for group in match.groups() if group is not None))
            for match in _TP_RANK.finditer(self.prefix)
        ]
        if not ranks and (named := _WORKER_AT_START.match(self.payload)) is not None:
            ranks = [int(named.group(1))]  # a worker's name alone at the line's start: a prefix shortened by hand
        return max(ranks) if ranks else None

    @property
    def rank(self) -> int | None:
        """The tensor-parallel rank the prefix names (`rank=1`, `[rank1]:`, `Worker_TP1`), None when none."""
        match = _RANK.search(self.prefix)
        if match is None:
            return None
        return int(next(group for group in match.groups() if group is not None))


# What a web page or a word processor made of the ASCII quotes a log printed (U+2019 in "The model's").
_TYPOGRAPHIC = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def undo_the_paste(text: str) -> str:
    """Terminal colours, real or pasted as `^[[`, dropped; typographic quotes a paste made back to ASCII."""
    return _ANSI.sub("", text).translate(_TYPOGRAPHIC)


def records(text: str) -> list[Record]:
    return _without_a_cut_prefix(_rejoin_long_messages(join_lines(undo_the_paste(text).splitlines())))


def _without_a_cut_prefix(read: list[Record]) -> list[Record]:
    """The records less a last line that is only the start of the prefix the line before it has (digits aside):
    an excerpt cut inside the next line's prefix (`WARN  PyProcess`) holds nothing of that line's message."""
    if len(read) < 2:
        return read
    last, before = _masked(read[-1].text.strip()), _masked(read[-2].prefix.strip())
    return read[:-1] if last and len(last) < len(before) and before.startswith(last) else read


def _masked(text: str) -> str:
    """Digits masked, as a prefix's shape is compared (its clock and pids change from line to line)."""
    return re.sub(r"\d+", "9", text)


def join_lines(lines: list[str]) -> list[Record]:
    prefixes, columns = line_prefixes(lines)
    non_empty = [prefix for line, prefix in zip(lines, prefixes, strict=True) if line.strip()]
    prefixed_log = bool(non_empty) and sum(1 for prefix in non_empty if prefix) >= _PREFIXED_LOG_SHARE * len(non_empty)
    # Each record as its prefix and its parts, joined once at the end (a long run of continuations stays linear),
    # and the column its message starts at after its head (0 without one): where a hanging indent puts the rest.
    joined: list[tuple[str, list[str]]] = []
    message_at = 0
    size = 0
    for line, prefix, column in zip(lines, prefixes, columns, strict=True):
        # A quoted paste (`> `, `│ `, `▎ ` on every line) repeats its bar on the lines a wrap made: under the same
        # bar, a line is read as an unprefixed one would be.
        quoted = bool(prefix) and bool(joined) and joined[-1][0] == prefix and _QUOTE_BAR.fullmatch(prefix)
        body = line[len(prefix) :] if quoted else line
        if (
            joined
            and size + len(line) <= _MAX_RECORD_CHARS
            and _continues(
                body, "" if quoted else prefix, joined[-1], prefixed_log=prefixed_log and not quoted, hanging=message_at
            )
        ):
            parts = joined[-1][1]
            glue = _glue(parts[-1], body)
            parts.append(glue)
            size += len(glue)
        else:
            joined.append((prefix, [line]))
            message_at = column
            size = len(line)
    return [Record(text="".join(parts), prefix=prefix) for prefix, parts in joined]


NUMBER = r"(-?[\d.]+)"  # a number as vLLM prints it in a message, a negative one too


def error_text(match: re.Match[str], error: str = "ValueError:") -> str:
    """The error as vLLM raised it, from a match in a record: from `error` on where the record has it, else from
    the match."""
    text = match.string
    at = text.find(error)
    return text[at:].strip() if at >= 0 else text[match.start() :].strip()


def loose(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """A message pattern that also matches where a wrap dropped or added whitespace: each literal space outside a
    character class matches any run of whitespace, or none, and so does the inside of a literal parenthesis (a
    terminal wraps "KV cache (" before "3984)" as readily as between words)."""
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            if char in "()" and not in_class:  # a group, so that a quantifier after it still applies to it all
                out[-1] = r"(?:\(\s*)" if char == "(" else r"(?:\s*\))"
            else:
                out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[" and not in_class:
            in_class = True
            out.append(char)
        elif char == "]" and in_class:
            in_class = False
            out.append(char)
        elif char == " " and not in_class:
            out.append(r"\s*")
        else:
            out.append(char)
    return re.compile("".join(out), flags)


# vLLM messages long enough to be wrapped by hand, as their start and what must follow it. V1's KV refusal is one
# sentence of 200 characters: a note's author who broke it before a capitalised word ("... than the available" /
# "KV cache memory (2.18 GiB).") left its end on a record of its own, which nothing else would join.
_LONG_MESSAGES = ((loose(r"To serve at least one request with the model"), loose(r"available KV cache memory \(")),)
_LONG_MESSAGE_RECORDS = 3  # the most records one such message is put back together from


def _rejoin_long_messages(read: list[Record]) -> list[Record]:
    rejoined: list[Record] = []
    index = 0
    while index < len(read):
        record = read[index]
        index += 1
        for start, end in _LONG_MESSAGES:
            if not start.search(record.text) or end.search(record.text):
                continue
            text, taken = record.text, index
            last = min(len(read), index + _LONG_MESSAGE_RECORDS - 1)
            while taken < last and read[taken].process in ("", record.process):  # not another process's line
                text = f"{text} {read[taken].payload.strip()}"
                taken += 1
                if end.search(text):
                    record, index = Record(text=text, prefix=record.prefix), taken
                    break
        rejoined.append(record)
    return rejoined


def _continues(line: str, prefix: str, previous: tuple[str, list[str]], *, prefixed_log: bool, hanging: int) -> bool:
    last_part = previous[1][-1]
    if prefix or not line.strip() or not last_part.strip():
        return False
    indent = len(line) - len(line.lstrip(" "))
    if hanging and indent == hanging and not _RECORD_START.match(line[indent:]):
        return True  # a hanging indent, under the message it continues
    if indent and _continues_indented(line, indent, previous[1]):
        return True
    if _RECORD_START.match(line):
        return False
    if prefixed_log:
        return True  # an unprefixed line among prefixed ones: a terminal or a paste wrapped the one before
    # An unprefixed log (a bare traceback, a paste): a line that starts like the rest of a sentence continues it.
    first = line[0]
    last = last_part[-1]
    # Closing punctuation never starts a record of its own: the wrap fell just before it.
    return first.islower() or first.isdigit() or first in "()]}.,;" or last.isspace() or last in ",("


def _continues_indented(line: str, indent: int, parts: list[str]) -> bool:
    """An indented line that goes on with the record's sentence rather than starting a traceback's line."""
    block, last_part, rest = parts[0], parts[-1], line[indent]
    if EXCEPTION_LINE.match(block) and (rest.islower() or rest.isdigit() or rest == "("):
        return True  # an exception's message wrapped under it: a traceback's code comes before the exception line
    if indent == len(block) - len(block.lstrip(" ")) and not _RECORD_START.match(line[indent:]):
        # A block indented as a whole (Markdown's code block): its wrapped lines keep the block's indent, so the
        # rest of a sentence starts after it, or after a long line that no sentence's end closed.
        wrapped = len(last_part) >= _WRAPPED_AT and last_part[-1] not in ".:!?" and rest.isalnum()
        return rest.islower() or rest.isdigit() or rest == "(" or wrapped
    # A sentence cut at its comma, the rest indented under it (a note's author wrapped it).
    return last_part.rstrip()[-1:] == "," and (rest.isdigit() or rest.islower())


def _glue(before: str, after: str) -> str:
    """`after` as it continues `before`: with no space where a word was cut (`KV cach` + `e`; loose patterns
    absorb a space the paste lost), with one where the wrap fell between punctuation and a word."""
    if after[:1] == " " and not before[-1:].isspace():
        return " " + after.lstrip(" ")  # a hanging indent: the wrap fell on a space
    if before[-1:].isspace() or after[:1].isspace():
        return after
    if (before[-1:].isalpha() and after[:1].isalpha()) or after[:1] in ")]},.;":
        return after
    return " " + after
