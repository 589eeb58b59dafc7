"""A setting's numeric range, written once on its type and read from there. Pure, no I/O.

A field of a core dataclass (`PolicySettings`, `DeriveSettings`) declares its range as annotated_types markers on
its type (`Annotated[float, Gt(0), Le(1)]`). The same markers are what pydantic enforces, so the daemon's flags
copy them (`field_bounds`) instead of restating them; the dataclass checks its own values with `first_violation`,
and the help and the error lines word them with `bounds_words`. One statement, three readers.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from dataclasses import fields
from typing import Annotated, Any

from annotated_types import Ge, Gt, Interval, Le, Lt

Bound = Gt | Ge | Lt | Le

__all__ = ["Annotated", "Bound", "Ge", "Gt", "Le", "Lt", "bounds_words", "field_bounds", "first_violation"]


def _markers(annotation: object) -> tuple[Bound, ...]:
    """The bounds in `Annotated[T, ...]`, also inside `Annotated[T, ...] | None`."""
    found: list[Bound] = []
    for metadata in getattr(annotation, "__metadata__", ()):
        if isinstance(metadata, Gt | Ge | Lt | Le):
            found.append(metadata)
        elif isinstance(metadata, Interval):
            found.extend(bound for bound in metadata if isinstance(bound, Gt | Ge | Lt | Le))
    for argument in typing.get_args(annotation):
        if argument is not type(None) and not found:
            found.extend(_markers(argument))
    return tuple(found)


_HINTS: dict[type, dict[str, Any]] = {}


def field_bounds(owner: type, name: str) -> tuple[Bound, ...]:
    """The bounds declared on `owner.name`'s type (a dataclass or any annotated class)."""
    hints = _HINTS.get(owner)
    if hints is None:  # resolved once per class: settings are built at start, and checked in tests by the hundred
        hints = _HINTS[owner] = typing.get_type_hints(owner, include_extras=True)
    return _markers(hints[name])


def pydantic_bounds(owner: type, name: str) -> dict[str, Any]:
    """The same bounds as pydantic's `Field(gt=..., le=...)` keywords."""
    keywords: dict[str, Any] = {}
    for bound in field_bounds(owner, name):
        key, limit = _key_and_limit(bound)
        keywords[key] = limit
    return keywords


def _key_and_limit(bound: Bound) -> tuple[str, float]:
    if isinstance(bound, Gt):
        return "gt", float(typing.cast("float", bound.gt))
    if isinstance(bound, Ge):
        return "ge", float(typing.cast("float", bound.ge))
    if isinstance(bound, Lt):
        return "lt", float(typing.cast("float", bound.lt))
    return "le", float(typing.cast("float", bound.le))


_SIGNS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def bounds_words(bounds: Iterable[Bound]) -> str:
    """`> 0 and <= 1`; `0 to 60` for a closed range; "" without bounds."""
    pairs = dict(_key_and_limit(bound) for bound in bounds)
    if set(pairs) == {"ge", "le"}:
        return f"{_number(pairs['ge'])} to {_number(pairs['le'])}"
    return " and ".join(f"{_SIGNS[key]} {_number(limit)}" for key, limit in pairs.items())


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"  # 1073741824, not 1.07374e+09


def _holds(bound: Bound, value: float) -> bool:
    key, limit = _key_and_limit(bound)
    return {"gt": value > limit, "ge": value >= limit, "lt": value < limit, "le": value <= limit}[key]


def first_violation(instance: Any) -> str | None:
    """The first field of the dataclass `instance` whose value breaks its declared bounds, as one sentence
    (`pause_kv_usage_ratio must be > 0 and <= 1, got 1.5`); None when every value is in range."""
    for field in fields(instance):
        value = getattr(instance, field.name)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        bounds = field_bounds(type(instance), field.name)
        if not all(_holds(bound, value) for bound in bounds):
            return f"{field.name} must be {bounds_words(bounds)}, got {value!r}"
    return None
