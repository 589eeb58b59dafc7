"""How values are written into one-line messages, in one place. Pure."""

from __future__ import annotations

GIB = 1024**3


def one_line(text: str, limit: int | None = None) -> str:
    """Whitespace (newlines included) collapsed to single spaces; cut to `limit` characters, with "...", when
    given: what goes into a log field, an outcome's detail or a notification."""
    flat = " ".join(text.split())
    if limit is None or len(flat) <= limit:
        return flat
    return flat[: limit - 3] + "..."


def gib(value_bytes: float, digits: int = 1) -> str:
    """`71.2 GiB`."""
    return f"{value_bytes / GIB:.{digits}f} GiB"
