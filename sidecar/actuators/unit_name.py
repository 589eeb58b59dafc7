"""Check a systemd service name before it goes anywhere near D-Bus. No I/O.

The name comes from settings, so it is a security boundary: whatever passes here is sent to systemd as is, and
nothing that passes may name another kind of unit, a path, or an option. The rules are systemd's own
(`unit_name_is_valid`: letters, digits and `:_.-@\\`, at most 255 characters) narrowed to what a restart needs:
a `.service`, not a bare template, and no leading `-` so no tool can take it for an option.
"""

from __future__ import annotations

import re

UNIT_NAME_MAX_CHARS = 255  # systemd's UNIT_NAME_MAX (256 with the terminating NUL)
SERVICE_SUFFIX = ".service"
_ALLOWED = re.compile(r"[A-Za-z0-9:_.\-@\\]*")
_SHOWN_CHARS = 40  # how much of a rejected name the error repeats


def validate_unit_name(unit: str) -> str:
    """Return `unit` unchanged, or raise ValueError naming the first rule it breaks."""
    problem = _problem(unit)
    if problem is not None:
        shown = unit if len(unit) <= _SHOWN_CHARS else unit[:_SHOWN_CHARS] + "..."
        raise ValueError(f"systemd unit name {shown!r} {problem}")
    return unit


def _problem(unit: str) -> str | None:  # noqa: PLR0911 - one return per rule: this is the list of rules
    if not unit:
        return "is empty"
    if len(unit) > UNIT_NAME_MAX_CHARS:
        return f"is {len(unit)} characters long; systemd allows at most {UNIT_NAME_MAX_CHARS}"
    if "/" in unit:
        return "contains a path separator '/'; give a unit name such as vllm.service, not a path"
    if unit.startswith("-"):
        return "starts with '-'; it could be taken for an option"
    bad = next((char for char in unit if not _ALLOWED.fullmatch(char)), None)
    if bad is not None:
        return f"contains {bad!r}; only letters, digits and ':_.-@\\' are allowed"
    if not unit.endswith(SERVICE_SUFFIX):
        return f"does not end in '{SERVICE_SUFFIX}'; only a service can be restarted"
    stem = unit.removesuffix(SERVICE_SUFFIX)
    if not stem:
        return f"has nothing before '{SERVICE_SUFFIX}'"
    if stem.startswith("@"):
        return "starts with '@'; a unit needs a name before the instance"
    if stem.find("@") == len(stem) - 1:
        # Only the first '@' separates the instance (systemd's unit_name_is_valid): "a@b@.service" is the
        # instance "b@" of a@.service, not a template.
        return "is a template with no instance; name one, such as vllm@0.service"
    return None
