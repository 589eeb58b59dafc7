"""How a setting is declared: its default, one line of help, its help group, and where the pure core's
settings feed it its default and range. No I/O."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sidecar.bounds import pydantic_bounds
from sidecar.derive.settings import DeriveSettings
from sidecar.policy.settings import PolicySettings

# The help's groups, in the order `run --help` shows them.
READING = "reading vLLM and the GPUs"
DERIVING = "derived metrics"
PAUSING = "pausing admission (/readyz 503)"
RESTARTING = "restarting vLLM"
ADAPTER = "how vLLM is restarted"
TELLING = "notifications and why vLLM died"
SERVING = "the sidecar's own HTTP server"
GENERAL = "general"
GROUP_ORDER = (GENERAL, READING, DERIVING, PAUSING, RESTARTING, ADAPTER, TELLING, SERVING)


def setting(
    default: Any,
    description: str,
    *,
    group: str,
    form: str | None = None,
    metavar: str | None = None,
    unit: str | None = None,
    note: str | None = None,
    why: str | None = None,
    core: tuple[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    """A setting: its default, one line of help and its help group. `form`: what a text setting accepts where
    no type can say it (a URL, HOST:PORT); `unit`: a number's; `note`: a rule its range cannot say; `why`: the
    longer explanation docs/settings.md gives; `core`: the pure core's field it feeds. Its type, range and
    choices are stated by the field itself (`sidecar.config.accepted` words them)."""
    stated = {"group": group, "format": form, "metavar": metavar, "unit": unit, "note": note, "why": why}
    extra: dict[str, Any] = {key: value for key, value in stated.items() if value is not None}
    if core is not None:
        extra[core[0]] = core[1]
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


# The pure core's settings hold the defaults and ranges; a setting that feeds one names its field there and takes
# both from it, so the flag, the policy, the alert rules and the dashboard cannot disagree (see `core_values`).
POLICY = PolicySettings()
DERIVE = DeriveSettings()


def policy_setting(field: str, description: str, **kwargs: Any) -> Any:
    """A setting that is `PolicySettings.<field>`: its default and range are the policy's."""
    bounds = pydantic_bounds(PolicySettings, field)
    return setting(getattr(POLICY, field), description, core=("policy", field), **bounds, **kwargs)


def derive_setting(field: str, description: str, *, group: str = DERIVING, **kwargs: Any) -> Any:
    """A setting that is `DeriveSettings.<field>`: its default and range are the derivation's."""
    bounds = pydantic_bounds(DeriveSettings, field)
    return setting(getattr(DERIVE, field), description, group=group, core=("derive", field), **bounds, **kwargs)
