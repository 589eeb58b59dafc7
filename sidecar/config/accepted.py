"""What a setting accepts, in words and as a placeholder, read from its declaration. No I/O.

A setting states its type, range and choices once, in its pydantic field (or, for one that feeds the pure core, on
the core dataclass's field: `sidecar.bounds`); the help, the error lines and docs/settings.md word them from
there, so a range changed in one place cannot leave a stale sentence in another. What no type can say (a URL's
form, a rule between two settings) is the field's `format` or `note` in its schema extra.
"""

from __future__ import annotations

import typing
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic.fields import FieldInfo

from sidecar.bounds import Bound, Ge, Gt, Le, Lt, bounds_words

# What pydantic reads as a bool from text (also t|f, y|n): a flag's value is read like an environment variable's.
BOOLEAN_FORMS = "true|false, 1|0, yes|no, on|off"

# Placeholders by unit, for the help's `--interval SECONDS`.
_UNIT_METAVARS = {
    "seconds": "SECONDS",
    "a ratio": "RATIO",
    "bytes": "BYTES",
    "a whole number": "N",
    "a number": "NUMBER",
}


def extra_of(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def value_type(field: FieldInfo) -> object:
    """The field's type without `| None`: `float` for `float | None`."""
    arguments = [argument for argument in typing.get_args(field.annotation) if argument is not type(None)]
    if typing.get_origin(field.annotation) is not Literal and len(arguments) == 1:
        return arguments[0]
    return field.annotation


def choices(field: FieldInfo) -> tuple[str, ...]:
    """A Literal's values or an enum's, as written on the command line; () for any other type."""
    kind = value_type(field)
    if typing.get_origin(kind) is Literal:
        return tuple(str(choice) for choice in typing.get_args(kind))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return tuple(str(member.value) for member in kind)
    return ()


def unit(field: FieldInfo) -> str | None:
    """A number's unit: the schema extra's `unit`, else the core field's name (`..._s`: seconds, `..._ratio`: a
    ratio), else whole number or number; None for a setting that is not a number."""
    kind = value_type(field)
    if kind is bool or kind not in (int, float):
        return None
    extra = extra_of(field)
    stated = extra.get("unit")
    if isinstance(stated, str):
        return stated
    core = extra.get("policy") or extra.get("derive")
    if isinstance(core, str) and core.endswith("_s"):
        return "seconds"
    if isinstance(core, str) and core.endswith("_ratio"):
        return "a ratio"
    return "a whole number" if kind is int else "a number"


def bounds(field: FieldInfo) -> tuple[Bound, ...]:
    return tuple(marker for marker in field.metadata if isinstance(marker, Gt | Ge | Lt | Le))


def accepted(field: FieldInfo) -> str | None:
    """`seconds, > 0 and <= 3600`; `nvml, sim or none`; the form of a bool; the field's `format`; with its
    `note` after a semicolon. None when nothing can be said."""
    extra = extra_of(field)
    words = _accepted_without_note(field, extra)
    note = extra.get("note")
    if isinstance(note, str):
        return f"{words}; {note}" if words else note
    return words


def _accepted_without_note(field: FieldInfo, extra: dict[str, Any]) -> str | None:
    if value_type(field) is bool:
        return BOOLEAN_FORMS
    listed = choices(field)
    if listed:
        return listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} or {listed[-1]}"
    number_unit = unit(field)
    if number_unit is not None:
        range_words = bounds_words(bounds(field))
        return f"{number_unit}, {range_words}" if range_words else number_unit
    stated = extra.get("format")
    return stated if isinstance(stated, str) else None


def metavar(field: FieldInfo) -> str | None:
    """The help's placeholder: the schema extra's `metavar`, else by unit or type (SECONDS, PATH...); None where
    argparse's own is right (choices, which it lists)."""
    extra = extra_of(field)
    stated = extra.get("metavar")
    if isinstance(stated, str):
        return stated
    if value_type(field) is bool or choices(field):
        return None
    number_unit = unit(field)
    if number_unit is not None:
        return _UNIT_METAVARS.get(number_unit, "NUMBER")
    if value_type(field) is Path:
        return "PATH"
    return "TEXT"
