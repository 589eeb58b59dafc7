"""Kubernetes object names: validation (RFC 1123) and generated Event names. Pure, no I/O.

Every name that goes into a request path is checked here first, so no input (a setting, an environment
variable, an ownerReference the server returned) can make the adapter address another resource: a name
can hold no `/`, `..`, `?`, `%` or whitespace.
"""

from __future__ import annotations

import re

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_EVENT_REASON = re.compile(r"[A-Z][A-Za-z0-9]*")
LABEL_MAX_CHARS = 63
SUBDOMAIN_MAX_CHARS = 253
EVENT_REASON_MAX_CHARS = 128


class KubeNameError(ValueError):
    """A name is not a valid Kubernetes name of the kind asked; the message says which rule it breaks."""


def check_label(name: str, *, what: str) -> str:
    """An RFC 1123 label (namespaces): lowercase alphanumerics and '-', at most 63, alphanumeric at both ends."""
    if len(name) > LABEL_MAX_CHARS or not _LABEL.fullmatch(name):
        raise KubeNameError(
            f"{what} {name!r} is not a valid RFC 1123 label (lowercase letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {LABEL_MAX_CHARS} characters)"
        )
    return name


def check_subdomain(name: str, *, what: str) -> str:
    """An RFC 1123 subdomain (pods, ReplicaSets, Deployments, Events): labels joined by '.', at most 253."""
    if len(name) > SUBDOMAIN_MAX_CHARS or not _SUBDOMAIN.fullmatch(name):
        raise KubeNameError(
            f"{what} {name!r} is not a valid RFC 1123 subdomain (lowercase letters, digits, '-' and '.', "
            f"starting and ending with a letter or digit, at most {SUBDOMAIN_MAX_CHARS} characters)"
        )
    return name


def check_event_reason(reason: str) -> str:
    """An Event reason in CamelCase (what `kubectl get events` shows in REASON), e.g. `RestartStarted`."""
    if len(reason) > EVENT_REASON_MAX_CHARS or not _EVENT_REASON.fullmatch(reason):
        raise KubeNameError(
            f"event reason {reason!r} is not CamelCase (an upper-case letter, then letters and digits, "
            f"at most {EVENT_REASON_MAX_CHARS} characters)"
        )
    return reason


def event_name(object_name: str, wall_time_ns: int) -> str:
    """`<object>.<hex nanoseconds>`, as client-go's event recorder names Events, kept a valid subdomain.

    The suffix is 16 hex digits at most; a long object name is cut so the whole fits 253 characters and
    still ends with a letter or digit.
    """
    suffix = f".{wall_time_ns:x}"
    prefix = object_name[: SUBDOMAIN_MAX_CHARS - len(suffix)].rstrip("-.")
    return check_subdomain(prefix + suffix, what="event name")
