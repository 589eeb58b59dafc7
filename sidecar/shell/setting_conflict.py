"""Rules between two settings, and which of the two an error blames. No I/O.

`--pause-kv-usage 0.5` with the default `--resume-kv-usage 0.80` breaks a rule between the two; the error
must name pause, the one the user gave, not resume. So a broken rule is raised as a `ConflictError` that
carries both names and what to say about either, and the error line blames the one from the higher layer
(flag > environment > file > default), or the rule's first name when both came from the same layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config.setting_origin import Origin, flag_of


class ConflictError(ValueError):
    """Two settings that cannot go together; `reasons[i]` is what to say when `names[i]` is blamed, with
    `{other}` standing for the other setting and its value."""

    def __init__(self, *, names: tuple[str, str], values: tuple[object, object], reasons: tuple[str, str]) -> None:
        super().__init__(reasons[0].format(other=_quoted(names[1], values[1], None)))
        self.names = names
        self.values = values
        self.reasons = reasons


@dataclass(frozen=True, slots=True, kw_only=True)
class Blame:
    setting: str
    value: object
    message: str


def find_conflict(values: Mapping[str, object]) -> ConflictError | None:
    """The first rule between two settings that `values` (a model's settings, validated one by one) breaks."""
    # A model without a rule's settings (`once` has no policy) skips that rule.
    pause, resume = values.get("pause_kv_usage"), values.get("resume_kv_usage")
    if isinstance(pause, float) and isinstance(resume, float) and resume >= pause:
        flaps = "or admission flaps around one value"
        return ConflictError(
            names=("resume_kv_usage", "pause_kv_usage"),
            values=(resume, pause),
            reasons=(f"must be below {{other}}, {flaps}", f"must be above {{other}}, {flaps}"),
        )
    timeout, interval = values.get("timeout"), values.get("interval")
    if isinstance(timeout, float) and isinstance(interval, float) and timeout >= interval:
        return ConflictError(
            names=("timeout", "interval"),
            values=(timeout, interval),
            reasons=(
                "must be shorter than {other}: one poll must end before the next",
                "must be longer than {other}: one poll must end before the next",
            ),
        )
    cert, key = values.get("tls_cert_file"), values.get("tls_key_file")
    if (cert is None) != (key is None):
        given, missing = ("tls_key_file", "tls_cert_file") if cert is None else ("tls_cert_file", "tls_key_file")
        return ConflictError(
            names=(given, missing),
            values=(key if cert is None else cert, None),
            reasons=(
                f"is set but {flag_of(missing)} is not: TLS needs both (or neither, for plain HTTP)",
                "must be set too: TLS needs both, and {other} is set",
            ),
        )
    if values.get("actuator") == "exec" and values.get("exec_command") is None:
        return ConflictError(
            names=("actuator", "exec_command"),
            values=("exec", None),
            reasons=(
                f"needs {flag_of('exec_command')} too (the command that restarts vLLM)",
                "must be set for {other}",
            ),
        )
    return None


def blame(conflict: ConflictError, origins: Mapping[str, Origin]) -> Blame:
    """The setting to name: the one from the higher layer; the rule's first on a tie or when unknown."""
    layers = [origins[name].layer if name in origins else None for name in conflict.names]
    first, second = (-1 if layer is None else int(layer) for layer in layers)
    index = 1 if second > first else 0
    other = 1 - index
    other_text = _quoted(conflict.names[other], conflict.values[other], origins.get(conflict.names[other]))
    return Blame(
        setting=conflict.names[index],
        value=conflict.values[index],
        message=conflict.reasons[index].format(other=other_text),
    )


def _quoted(name: str, value: object, origin: Origin | None) -> str:
    """`--pause-kv-usage (0.9, the default)`: the other setting as the user would find it."""
    if value is None:
        return flag_of(name)
    where = origin.short() if origin is not None else ""
    return f"{flag_of(name)} ({shown(value)}{where})"


def shown(value: object) -> str:
    """A value as a user would write it: 0.9, not 0.9000000000000001 or 9.0e-01."""
    return f"{value:g}" if isinstance(value, float) else str(value)
