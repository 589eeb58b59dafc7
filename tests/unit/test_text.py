"""The one home of the message helpers (sidecar/model/text.py)."""

from __future__ import annotations

from sidecar.model.text import gib, one_line, plural


def test_one_line_collapses_whitespace_and_cuts_only_when_asked() -> None:
    assert one_line("  a\n\tb   c \r\n") == "a b c"
    assert one_line("x" * 500) == "x" * 500
    assert one_line("abcdefgh", limit=6) == "abc..."
    assert one_line("abcdef", limit=6) == "abcdef"


def test_gib_writes_binary_gigabytes() -> None:
    assert gib(71.25 * 1024**3) == "71.2 GiB"
    assert gib(1024**3 // 2, digits=2) == "0.50 GiB"


def test_plural_is_singular_only_where_the_number_reads_one() -> None:
    assert plural(1, "request") == "1 request"
    assert [plural(n, "time") for n in (0, 2)] == ["0 times", "2 times"]
    assert plural(1.0, "request", spec="g") == "1 request"  # Prometheus counts arrive as floats
    assert plural(1.5, "request", spec="g") == "1.5 requests"
    assert plural(1204, "request", spec=",") == "1,204 requests"
    assert plural(0.6, "preemption", spec=",.0f") == "1 preemption"  # as it is shown, rounded
    assert plural(1, "shared prefix", "shared prefixes") == "1 shared prefix"
    assert plural(3, "shared prefix", "shared prefixes") == "3 shared prefixes"
    assert plural("10-20", "token") == "10-20 tokens"  # a range of lengths, as loadtest's spec prints one
