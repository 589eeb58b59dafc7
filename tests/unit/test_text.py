"""The one home of the message helpers (sidecar/model/text.py)."""

from __future__ import annotations

from sidecar.model.text import gib, one_line


def test_one_line_collapses_whitespace_and_cuts_only_when_asked() -> None:
    assert one_line("  a\n\tb   c \r\n") == "a b c"
    assert one_line("x" * 500) == "x" * 500
    assert one_line("abcdefgh", limit=6) == "abc..."
    assert one_line("abcdef", limit=6) == "abcdef"


def test_gib_writes_binary_gigabytes() -> None:
    assert gib(71.25 * 1024**3) == "71.2 GiB"
    assert gib(1024**3 // 2, digits=2) == "0.50 GiB"
