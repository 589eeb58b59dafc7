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


def plural(count: object, noun: str, plural_noun: str | None = None, *, spec: str = "") -> str:
    """`1 request`, `3 requests`, `1,204 requests`: `count` formatted with `spec` (a format spec such as `,` or
    `g`), then the noun, singular only where the number reads 1 (so `1.0` with `g` is singular, `1.5` not, and
    any value that formats as a number, a range such as `10-20` included, takes the plural). `plural_noun` where
    an "s" does not make it (`prefix`, `prefixes`)."""
    shown = format(count, spec)
    return f"{shown} {noun if shown == '1' else plural_noun or noun + 's'}"
