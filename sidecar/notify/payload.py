"""What a webhook receives, and how it is signed. Pure: no I/O, no clock reads (times are arguments).

Two bodies, both `application/json`:

- the generic document, `{"source": "vllm-sidecar", "kind", "summary", "reason", "time", "dry_run",
  "details", "host", "pod", "cause"}` (`time` is RFC 3339 in UTC, from the notification's wall time;
  `cause` is null, or why vLLM died as its log says: `{"cause", "severity", "summary", "evidence",
  "recommendations": [{"flag", "value", "why"}], "steps", "source", "read_at"}`, `cause` null when unknown;
  `incident`: null, or the incident folder kept for it, docs/incidents.md);
- the Slack-compatible one, `{"text": "..."}`: one line, an emoji per kind, a dry run reads "would"; a
  second line with the cause and the flags to change when the notification carries one, and a last line
  `incident <folder>` when it names one.
  Slack incoming webhooks (and Mattermost, Rocket.Chat, Teams' Slack-compatible connectors) accept it.

Signature (only when a key is configured). The sender adds two headers:

    X-Vllm-Sidecar-Timestamp: <Unix seconds when this attempt was sent, an integer>
    X-Vllm-Sidecar-Signature: sha256=<hex of HMAC-SHA256(key, timestamp + "." + body)>

A receiver verifies it this way (`verify_signature` does all of it):

1. read the raw body bytes, before any JSON parsing (re-serialising changes the bytes);
2. compute `HMAC-SHA256(key, timestamp_header.encode() + b"." + body)` and compare its hex, prefixed with
   `sha256=`, with the signature header in constant time (`hmac.compare_digest`);
3. reject a timestamp more than a few minutes away from its own clock (300 s here by default): a captured
   request replayed later then fails, since the timestamp is inside what is signed. Every retry is signed
   afresh with its own timestamp, so a late retry still passes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TypedDict

from sidecar.model.cause import CrashCause
from sidecar.notify.message import Notification, NotificationKind

SOURCE = "vllm-sidecar"
SIGNATURE_HEADER = "X-Vllm-Sidecar-Signature"
TIMESTAMP_HEADER = "X-Vllm-Sidecar-Timestamp"
SIGNATURE_PREFIX = "sha256="
DEFAULT_MAX_AGE_S = 300.0

EMOJI: dict[NotificationKind, str] = {
    NotificationKind.PAUSE: "\N{DOUBLE VERTICAL BAR}\N{VARIATION SELECTOR-16}",
    NotificationKind.RESUME: "\N{BLACK RIGHT-POINTING TRIANGLE}\N{VARIATION SELECTOR-16}",
    NotificationKind.RESTART_BEGIN: "\N{ANTICLOCKWISE DOWNWARDS AND UPWARDS OPEN CIRCLE ARROWS}",
    NotificationKind.RESTART_END: "\N{WHITE HEAVY CHECK MARK}",
    NotificationKind.RESTART_FAILURE: "\N{CROSS MARK}",
    NotificationKind.BUDGET_EXHAUSTED: "\N{OCTAGONAL SIGN}",
    NotificationKind.VLLM_RECOVERED: "\N{WARNING SIGN}\N{VARIATION SELECTOR-16}",
    NotificationKind.REMEDIATION: "\N{WRENCH}",
}


class WebhookFormat(StrEnum):
    JSON = "json"
    SLACK = "slack"


@dataclass(frozen=True, slots=True, kw_only=True)
class Origin:
    """Who sends: the host name, and the pod's name when running in Kubernetes."""

    host: str
    pod: str | None = None


class RecommendationDocument(TypedDict):
    flag: str
    value: int | float | str
    why: str


class CauseDocument(TypedDict):
    cause: str | None
    severity: str | None
    summary: str
    evidence: list[str]
    recommendations: list[RecommendationDocument]
    steps: list[str]
    source: str
    read_at: str


class JsonDocument(TypedDict):
    source: str
    kind: str
    summary: str
    reason: str
    time: str
    dry_run: bool
    details: dict[str, str]
    host: str
    pod: str | None
    cause: CauseDocument | None
    incident: str | None


class SlackDocument(TypedDict):
    text: str


def rfc3339(wall_time_s: float) -> str:
    """`2025-01-02T03:04:05.678Z`: UTC, milliseconds."""
    moment = datetime.fromtimestamp(wall_time_s, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_document(notification: Notification, origin: Origin) -> JsonDocument:
    return JsonDocument(
        source=SOURCE,
        kind=notification.kind.value,
        summary=notification.summary,
        reason=notification.reason,
        time=rfc3339(notification.wall_time_s),
        dry_run=notification.dry_run,
        details=dict(notification.details),
        host=origin.host,
        pod=origin.pod,
        cause=cause_document(notification.cause) if notification.cause is not None else None,
        incident=notification.incident,
    )


def cause_document(cause: CrashCause) -> CauseDocument:
    return CauseDocument(
        cause=cause.cause,
        severity=cause.severity,
        summary=cause.summary,
        evidence=list(cause.evidence),
        recommendations=[
            RecommendationDocument(flag=change.flag, value=change.value, why=change.why)
            for change in cause.recommendations
        ],
        steps=list(cause.steps),
        source=cause.source,
        read_at=rfc3339(cause.read_wall_time_s),
    )


def slack_document(notification: Notification, origin: Origin) -> SlackDocument:
    """`<emoji> vllm-sidecar on <pod or host>: [dry run] would: <summary> (<reason>)`, one line; with a cause,
    a second: `cause <name>: <summary>; change <flags>` (or `cause unknown: <why>`)."""
    where = origin.pod or origin.host
    would = "[dry run] would: " if notification.dry_run else ""
    line = f"{EMOJI[notification.kind]} {SOURCE} on {where}: {would}{notification.summary} ({notification.reason})"
    text = " ".join(line.split())
    if notification.cause is not None:
        text += "\n" + " ".join(notification.cause.line().split())
    if notification.incident is not None:
        text += "\nincident " + " ".join(notification.incident.split())
    return SlackDocument(text=_slack_escape(text))


def render_body(notification: Notification, origin: Origin, fmt: WebhookFormat) -> bytes:
    """The exact bytes sent (and signed): compact JSON, UTF-8."""
    document = (
        json_document(notification, origin) if fmt is WebhookFormat.JSON else slack_document(notification, origin)
    )
    # A lone surrogate (how Python holds bytes of an environment variable that were not UTF-8) cannot be UTF-8:
    # written as its JSON escape `\udcff` instead, which is still inside a JSON string and decodes back to it.
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def signature(key: bytes, timestamp: str, body: bytes) -> str:
    """`sha256=<hex of HMAC-SHA256(key, timestamp + "." + body)>`."""
    digest = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def signature_headers(key: bytes, body: bytes, *, wall_time_s: float) -> dict[str, str]:
    timestamp = str(int(wall_time_s))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(key, timestamp, body)}


def verify_signature(
    key: bytes,
    timestamp: str,
    body: bytes,
    header: str,
    *,
    now_s: float | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> bool:
    """True when `header` signs `timestamp` and `body` with `key` (compared in constant time).

    With `now_s` (the receiver's Unix time), a timestamp further than `max_age_s` from it is rejected too:
    the replay protection. Without it, only the signature is checked.
    """
    try:
        sent_s = int(timestamp)
        # A timestamp past float range is no time at all; `not <=` fails closed on a NaN clock too.
        if now_s is not None and not abs(now_s - sent_s) <= max_age_s:
            return False
    except (ValueError, OverflowError):
        return False
    return hmac.compare_digest(signature(key, timestamp, body).encode(), header.strip().encode())


def _slack_escape(text: str) -> str:
    # Slack reads <...> as links and mentions and & as an entity; its docs ask for exactly these three.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
