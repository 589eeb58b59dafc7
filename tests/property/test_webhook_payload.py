"""The webhook payload builder and its HMAC signature under any notification text.

Bodies: valid UTF-8 and valid JSON whatever the text (any Unicode, lone surrogates included: an environment
variable that is not UTF-8 reaches Python as surrogates, and an exec command's detail can carry one), the
JSON document round-trips exactly, the Slack line is one line with Slack's three characters escaped.
Signatures: what `signature_headers` signs `verify_signature` accepts; any change of a byte of the body, the
timestamp or the key is refused; and `verify_signature`, which a receiver runs on whatever arrives, answers
True or False for any input, never raises.
"""

from __future__ import annotations

import json
import math
from datetime import datetime

from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.payload import (
    EMOJI,
    SIGNATURE_PREFIX,
    TIMESTAMP_HEADER,
    Origin,
    WebhookFormat,
    json_document,
    render_body,
    signature,
    signature_headers,
    slack_document,
    verify_signature,
)
from tests.property.profile import budget

# Joined from a list, not st.text: st.text leaves out what UTF-8 cannot encode, the lone surrogates wanted here.
_texts = st.lists(
    st.one_of(
        st.characters(),
        st.sampled_from('<>&"\\\n\r\t\u2028\x85\x00 '),
        st.characters(codec=None, categories=["Cs"]),  # lone surrogates
    ),
    max_size=30,
).map("".join)
_notifications = st.builds(
    Notification,
    kind=st.sampled_from(NotificationKind),
    summary=_texts,
    reason=_texts,
    wall_time_s=st.floats(0, 4e9),  # 1970 to 2096: any clock the sidecar runs under
    dry_run=st.booleans(),
    details=st.dictionaries(_texts, _texts, max_size=3),
)
_origins = st.builds(Origin, host=_texts, pod=st.none() | _texts)
_SURROGATE_NOTE = Notification(
    kind=NotificationKind.RESTART_FAILURE, summary="would run restart-\udcff", reason="exec", wall_time_s=1.7e9
)


def _as_json_reads(value: object) -> object:
    """`value` as JSON gives it back: JSON's \\u escapes are UTF-16, so a high surrogate followed by a low one
    (two code points in a Python str, never made by surrogateescape, which only makes low ones) comes back as
    the one character the pair encodes. Lone surrogates come back as they are."""
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if isinstance(value, dict):
        return {_as_json_reads(key): _as_json_reads(item) for key, item in value.items()}
    return value


@budget()
@given(_notifications, _origins)
@example(_SURROGATE_NOTE, Origin(host="h"))  # used to raise UnicodeEncodeError: the notification was lost
def test_the_json_body_is_utf8_json_that_round_trips(notification: Notification, origin: Origin) -> None:
    body = render_body(notification, origin, WebhookFormat.JSON)
    document = json.loads(body.decode("utf-8"))  # strict UTF-8
    assert document == _as_json_reads(json_document(notification, origin))
    assert document["source"] == "vllm-sidecar"
    assert document["kind"] == notification.kind.value
    sent = datetime.fromisoformat(document["time"].replace("Z", "+00:00"))
    assert sent.utcoffset() is not None
    # Milliseconds, cut (not rounded) from the wall time; 1 us of slack for the float round trip.
    assert -1e-6 <= notification.wall_time_s - sent.timestamp() < 0.001 + 1e-6


def _slack_unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@budget()
@given(_notifications, _origins)
@example(_SURROGATE_NOTE, Origin(host="h"))
@example(
    Notification(kind=NotificationKind.PAUSE, summary="a\u2028b\x85c\rd", reason="r", wall_time_s=0.0), Origin(host="h")
)
def test_the_slack_body_is_one_escaped_line(notification: Notification, origin: Origin) -> None:
    body = render_body(notification, origin, WebhookFormat.SLACK)
    document = json.loads(body.decode("utf-8"))
    assert list(document) == ["text"]
    text = document["text"]
    assert text == _as_json_reads(slack_document(notification, origin)["text"])
    assert len(text.splitlines()) == 1  # one line: no break of any kind Python (or a chat client) knows
    assert "<" not in text
    assert ">" not in text
    assert text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "").count("&") == 0
    plain = _slack_unescape(text)
    assert plain.startswith(EMOJI[notification.kind] + " vllm-sidecar on ")
    if notification.dry_run:
        assert "[dry run] would: " in plain
    # Nothing of the summary is lost but its whitespace, which collapses to single spaces.
    assert str(_as_json_reads(" ".join(notification.summary.split()))) in plain


_keys = st.binary(min_size=1, max_size=64)
_bodies = st.binary(max_size=200)
_wall_times = st.floats(0, 4e9)


@budget()
@given(_keys, _bodies, _wall_times, st.data())
def test_a_signature_verifies_and_any_changed_byte_is_refused(
    key: bytes, body: bytes, wall_time_s: float, data: st.DataObject
) -> None:
    headers = signature_headers(key, body, wall_time_s=wall_time_s)
    timestamp, header = headers[TIMESTAMP_HEADER], headers["X-Vllm-Sidecar-Signature"]
    assert header.startswith(SIGNATURE_PREFIX)
    assert verify_signature(key, timestamp, body, header)
    assert verify_signature(key, timestamp, body, header, now_s=wall_time_s)
    assert not verify_signature(key, timestamp, body, header, now_s=wall_time_s + 301)  # a replay, later
    which = data.draw(st.sampled_from(["body", "key", "timestamp"] if body else ["key", "timestamp"]))
    original = {"body": body, "key": key, "timestamp": timestamp.encode()}[which]
    at = data.draw(st.integers(0, len(original) - 1))
    flip = data.draw(st.integers(1, 255))
    changed = original[:at] + bytes([original[at] ^ flip]) + original[at + 1 :]
    if which == "body":
        assert not verify_signature(key, timestamp, changed, header)
    elif which == "key":
        assert not verify_signature(changed, timestamp, body, header)
    else:
        forged = changed.decode("latin-1")
        assert forged == timestamp or not verify_signature(key, forged, body, header)


_timestamps = st.one_of(
    st.integers(0, 4 * 10**9).map(str),
    st.integers(-(10**400), 10**400).map(str),
    st.text(max_size=12),
    st.sampled_from(["", " 1", "1_0", "\u0661", "+5", "1e3", "nan", "9" * 5000]),
)


@budget(scale=2)
@given(
    _keys,
    _timestamps,
    _bodies,
    st.one_of(st.none(), st.text(max_size=80), st.just(SIGNATURE_PREFIX + "0" * 64)),  # None: the right one
    st.one_of(st.none(), st.sampled_from([math.nan, math.inf, -math.inf]), st.floats()),  # the receiver's clock
)
@example(b"k", "1" + "0" * 400, b"", "sha256=00", 1.7e9)  # used to raise OverflowError (int too large for float)
@example(b"k", "1", b"", signature(b"k", "1", b""), float("nan"))  # NaN skipped the replay check
def test_verification_answers_any_input_without_raising(
    key: bytes, timestamp: str, body: bytes, header: str | None, now_s: float | None
) -> None:
    if header is None:
        header = signature(key, timestamp, body)
    verdict = verify_signature(key, timestamp, body, header, now_s=now_s)
    assert isinstance(verdict, bool)
    if verdict:  # only ever for the right signature, and within the age asked for
        assert header.strip() == signature(key, timestamp, body)
        if now_s is not None:
            assert abs(now_s - int(timestamp)) <= 300  # NaN fails this: a clock that is not a number fails closed
