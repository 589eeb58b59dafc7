"""The webhook bodies and the HMAC signature: pure functions, no network."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from sidecar.notify.message import NotificationKind
from sidecar.notify.payload import (
    EMOJI,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Origin,
    WebhookFormat,
    json_document,
    render_body,
    rfc3339,
    signature,
    signature_headers,
    slack_document,
    verify_signature,
)
from tests.notify.conftest import OOM_CAUSE, ORIGIN, UNKNOWN_CAUSE, note

KEY = b"receiver-shared-key"


def test_json_document_has_the_documented_shape() -> None:
    document = json_document(note(details={"gpu": "0", "used_bytes": "123"}), ORIGIN)
    assert document == {
        "source": "vllm-sidecar",
        "kind": "pause",
        "summary": "admission paused: KV cache usage 0.93 >= 0.90",
        "reason": "kv_cache_usage",
        "time": "2023-11-14T22:13:20.500Z",
        "dry_run": False,
        "details": {"gpu": "0", "used_bytes": "123"},
        "host": "gpu-node-7",
        "pod": "vllm-0",
        "cause": None,
        "incident": None,
    }


INCIDENT = "/var/lib/vllm-sidecar/incidents/20231114T221320Z-engine_hung"


def test_json_and_slack_name_the_incident_folder() -> None:
    restarted = note(NotificationKind.RESTART_END, summary="vLLM healthy again", cause=OOM_CAUSE, incident=INCIDENT)
    assert json_document(restarted, ORIGIN)["incident"] == INCIDENT
    lines = slack_document(restarted, ORIGIN)["text"].split("\n")
    assert len(lines) == 3
    assert lines[1].startswith("cause configuration_overshoot")
    assert lines[2] == f"incident {INCIDENT}"


def test_json_document_carries_why_vllm_died_with_the_flags_to_change() -> None:
    document = json_document(note(NotificationKind.RESTART_BEGIN, reason="engine_dead", cause=OOM_CAUSE), ORIGIN)
    assert document["cause"] == {
        "cause": "configuration_overshoot",
        "severity": "critical",
        "summary": "vLLM died of a CUDA out-of-memory error while serving: another process took the memory",
        "evidence": [
            "CUDA out of memory while serving: tried to allocate 2.00 GiB",
            "another process on the GPU: pid 7",
        ],
        "recommendations": [
            {"flag": "--gpu-memory-utilization", "value": 0.87, "why": "(80 - 6 - 4) / 80"},
            {"flag": "--enforce-eager", "value": "", "why": "no CUDA graphs"},
        ],
        "steps": [],
        "source": "journal of vllm.service (system manager), invocation 2a14, 13 lines",
        "read_at": "2023-11-14T22:13:21.250Z",
    }
    parsed = json.loads(render_body(note(cause=UNKNOWN_CAUSE), ORIGIN, WebhookFormat.JSON))
    assert parsed["cause"]["cause"] is None
    assert parsed["cause"]["summary"] == "cannot read file /var/log/vllm.log: Permission denied"
    assert parsed["cause"]["recommendations"] == []


def test_slack_says_the_cause_and_the_flags_on_one_more_line() -> None:
    text = slack_document(note(NotificationKind.RESTART_END, summary="vLLM healthy\nagain", cause=OOM_CAUSE), ORIGIN)[
        "text"
    ]
    first, second = text.split("\n")
    assert first.endswith("vLLM healthy again (kv_cache_usage)")
    assert second == (
        "cause configuration_overshoot: vLLM died of a CUDA out-of-memory error while serving: another process "
        "took the memory; change --gpu-memory-utilization 0.87, --enforce-eager"
    )
    unknown = slack_document(note(cause=UNKNOWN_CAUSE), ORIGIN)["text"]
    assert unknown.split("\n")[1] == "cause unknown: cannot read file /var/log/vllm.log: Permission denied"


def test_json_body_is_compact_utf8_json_of_the_document_and_pod_may_be_null() -> None:
    origin = Origin(host="box")
    body = render_body(note(summary="café ≥ 0.9", dry_run=True), origin, WebhookFormat.JSON)
    assert b"\n" not in body
    assert b": " not in body
    parsed = json.loads(body.decode("utf-8"))
    assert parsed["pod"] is None
    assert parsed["host"] == "box"
    assert parsed["dry_run"] is True
    assert parsed["summary"] == "café ≥ 0.9"


@pytest.mark.parametrize(
    ("wall_time_s", "expected"),
    [(0.0, "1970-01-01T00:00:00.000Z"), (1_700_000_000.5, "2023-11-14T22:13:20.500Z")],
)
def test_time_is_rfc3339_utc(wall_time_s: float, expected: str) -> None:
    assert rfc3339(wall_time_s) == expected


def test_slack_document_is_one_line_of_text_with_the_kinds_emoji() -> None:
    document = slack_document(note(summary="paused\nnow"), ORIGIN)
    assert list(document) == ["text"]
    text = document["text"]
    assert "\n" not in text
    assert text.startswith(EMOJI[NotificationKind.PAUSE] + " ")
    assert "vllm-0" in text
    assert "paused now" in text
    assert "(kv_cache_usage)" in text
    assert "would" not in text


def test_slack_body_is_only_text() -> None:
    parsed = json.loads(render_body(note(), ORIGIN, WebhookFormat.SLACK))
    assert set(parsed) == {"text"}


def test_every_kind_has_its_own_emoji() -> None:
    assert set(EMOJI) == set(NotificationKind)
    assert len(set(EMOJI.values())) == len(NotificationKind)
    texts = {slack_document(note(kind), ORIGIN)["text"].split(" ")[0] for kind in NotificationKind}
    assert len(texts) == len(NotificationKind)


def test_slack_marks_a_dry_run_with_would() -> None:
    text = slack_document(note(NotificationKind.RESTART_BEGIN, summary="restart vLLM", dry_run=True), ORIGIN)["text"]
    assert "[dry run] would: restart vLLM" in text


def test_slack_escapes_its_control_characters() -> None:
    text = slack_document(note(summary="usage 0.93 >= 0.90 & <!channel>"), ORIGIN)["text"]
    assert "&gt;=" in text
    assert "&amp;" in text
    assert "&lt;!channel&gt;" in text
    assert "<" not in text


def test_slack_falls_back_to_the_host_without_a_pod() -> None:
    assert "on gpu-node-7:" in slack_document(note(), Origin(host="gpu-node-7"))["text"]


def test_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"a":1}'
    expected = hmac.new(KEY, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(KEY, "1700000000", body) == "sha256=" + expected


def test_signature_headers_carry_an_integer_timestamp_that_is_signed() -> None:
    body = b"{}"
    headers = signature_headers(KEY, body, wall_time_s=1_700_000_000.9)
    assert headers[TIMESTAMP_HEADER] == "1700000000"
    assert verify_signature(KEY, headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER])


def test_verify_rejects_a_wrong_key_a_changed_body_or_timestamp_and_garbage() -> None:
    body = b'{"kind":"pause"}'
    good = signature(KEY, "1700000000", body)
    assert verify_signature(KEY, "1700000000", body, good)
    assert not verify_signature(b"another-key", "1700000000", body, good)
    assert not verify_signature(KEY, "1700000000", body + b" ", good)
    assert not verify_signature(KEY, "1700000001", body, good)
    assert not verify_signature(KEY, "1700000000", body, good.removeprefix("sha256="))
    assert not verify_signature(KEY, "1700000000", body, "sha256=00")
    assert not verify_signature(KEY, "yesterday", body, good)


def test_verify_with_now_rejects_a_replayed_old_request() -> None:
    body = b"{}"
    good = signature(KEY, "1700000000", body)
    assert verify_signature(KEY, "1700000000", body, good, now_s=1_700_000_000 + 299)
    assert not verify_signature(KEY, "1700000000", body, good, now_s=1_700_000_000 + 301)
    assert not verify_signature(KEY, "1700000000", body, good, now_s=1_700_000_000 - 301)
    assert verify_signature(KEY, "1700000000", body, good, now_s=1_700_000_000 + 3000, max_age_s=3600)
