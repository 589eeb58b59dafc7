"""One POST to a loopback receiver per send: bodies, signature, how each answer is classified."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from sidecar.notify.payload import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookFormat, json_document, verify_signature
from sidecar.notify.sink import DeliveryStatus
from sidecar.notify.webhook import INVALID_URL, WebhookSink, redacted_url
from tests.loopback import closed_port
from tests.notify.conftest import ORIGIN, note
from tests.notify.receiver import HANG, Receiver, Reply

KEY = b"shared-webhook-key"


def sink(
    url: str,
    client: httpx.AsyncClient,
    *,
    format: WebhookFormat = WebhookFormat.JSON,
    hmac_key: bytes | None = None,
    timeout_s: float = 5.0,
    wall_clock: Callable[[], float] = time.time,
) -> WebhookSink:
    return WebhookSink(
        url, client=client, origin=ORIGIN, format=format, hmac_key=hmac_key, timeout_s=timeout_s, wall_clock=wall_clock
    )


async def test_json_webhook_posts_the_document(client: httpx.AsyncClient) -> None:
    async with Receiver([204]) as receiver:
        result = await sink(receiver.url + "/hooks/sidecar?team=ml", client).send(note())
    assert result.status is DeliveryStatus.DELIVERED
    assert result.detail == "HTTP 204"
    [request] = receiver.requests
    assert request.method == "POST"
    assert request.path == "/hooks/sidecar?team=ml"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("vllm-sidecar/")
    assert json.loads(request.body) == json_document(note(), ORIGIN)
    assert SIGNATURE_HEADER.lower() not in request.headers
    assert TIMESTAMP_HEADER.lower() not in request.headers


async def test_slack_webhook_posts_text_only(client: httpx.AsyncClient) -> None:
    async with Receiver([200]) as receiver:
        result = await sink(receiver.url + "/services/T0/B0/x", client, format=WebhookFormat.SLACK).send(note())
    assert result.status is DeliveryStatus.DELIVERED
    body = json.loads(receiver.requests[0].body)
    assert set(body) == {"text"}
    assert "admission paused" in body["text"]


async def test_hmac_signature_is_verified_by_the_receiver(client: httpx.AsyncClient) -> None:
    async with Receiver([200]) as receiver:
        webhook = sink(receiver.url + "/hook", client, hmac_key=KEY, wall_clock=lambda: 1_700_000_123.7)
        await webhook.send(note())
    [request] = receiver.requests
    timestamp = request.headers[TIMESTAMP_HEADER.lower()]
    header = request.headers[SIGNATURE_HEADER.lower()]
    assert timestamp == "1700000123"
    assert header.startswith("sha256=")
    assert verify_signature(KEY, timestamp, request.body, header, now_s=1_700_000_130.0)
    assert not verify_signature(b"wrong-key", timestamp, request.body, header)
    assert not verify_signature(KEY, timestamp, request.body, header, now_s=1_700_000_123.0 + 3600)


async def test_every_attempt_is_signed_with_a_real_timestamp(client: httpx.AsyncClient) -> None:
    async with Receiver([500, 200]) as receiver:
        webhook = sink(receiver.url + "/hook", client, hmac_key=KEY)
        await webhook.send(note())
        await webhook.send(note())
    for request in receiver.requests:
        timestamp = request.headers[TIMESTAMP_HEADER.lower()]
        assert verify_signature(
            KEY, timestamp, request.body, request.headers[SIGNATURE_HEADER.lower()], now_s=time.time()
        )


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, DeliveryStatus.DELIVERED),
        (202, DeliveryStatus.DELIVERED),
        (429, DeliveryStatus.RETRYABLE),
        (500, DeliveryStatus.RETRYABLE),
        (503, DeliveryStatus.RETRYABLE),
        (400, DeliveryStatus.PERMANENT),
        (403, DeliveryStatus.PERMANENT),
        (404, DeliveryStatus.PERMANENT),
        (301, DeliveryStatus.PERMANENT),
    ],
)
async def test_answers_are_classified(client: httpx.AsyncClient, status: int, expected: DeliveryStatus) -> None:
    async with Receiver([Reply(status, b"no_text")]) as receiver:
        result = await sink(receiver.url + "/hook", client).send(note())
    assert result.status is expected
    assert result.detail.startswith(f"HTTP {status}")
    if expected is not DeliveryStatus.DELIVERED:
        assert result.detail == f"HTTP {status}: no_text"


async def test_429_retry_after_is_reported(client: httpx.AsyncClient) -> None:
    async with Receiver([Reply(429, headers={"Retry-After": "7"}), Reply(503, headers={"Retry-After": "soon"})]) as rx:
        webhook = sink(rx.url + "/hook", client)
        limited = await webhook.send(note())
        unparsed = await webhook.send(note())
    assert limited.retry_after_s == 7.0
    assert unparsed.retry_after_s is None


async def test_connection_refused_is_retryable(client: httpx.AsyncClient) -> None:
    result = await sink(f"http://127.0.0.1:{closed_port()}/hook", client).send(note())
    assert result.status is DeliveryStatus.RETRYABLE
    assert "Connect" in result.detail


async def test_a_receiver_that_never_answers_times_out(client: httpx.AsyncClient) -> None:
    async with Receiver([HANG]) as receiver:
        started = time.monotonic()
        result = await sink(receiver.url + "/hook", client, timeout_s=0.2).send(note())
        elapsed_s = time.monotonic() - started
    assert result.status is DeliveryStatus.RETRYABLE
    assert result.detail == "timed out after 0.2 s"
    assert elapsed_s < 2.0


async def test_a_huge_answer_is_not_read_in_full(client: httpx.AsyncClient) -> None:
    async with Receiver([Reply(500, b"x" * 5_000_000)]) as receiver:
        result = await sink(receiver.url + "/hook", client).send(note())
    assert result.status is DeliveryStatus.RETRYABLE
    assert len(result.detail) <= 200


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://hooks.slack.com/services/T00/B00/XXXX", "https://hooks.slack.com/…"),
        ("https://user:password@example.com:8443/path?token=abc#frag", "https://example.com:8443/…"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000/…"),
        ("http://[::1]:9000/x", "http://[::1]:9000/…"),
        ("not a url", INVALID_URL),
        ("http://[::1/x", INVALID_URL),
        ("http://host:99999/x", INVALID_URL),
    ],
)
def test_redacted_url(url: str, expected: str) -> None:
    assert redacted_url(url) == expected


def test_the_name_is_redacted(client: httpx.AsyncClient) -> None:
    webhook = sink("https://hooks.slack.com/services/T00/B00/SECRET?token=QSECRET", client, hmac_key=b"k" * 8)
    assert webhook.name == "json webhook https://hooks.slack.com/…"
    assert "SECRET" not in repr(webhook)


@pytest.mark.parametrize("url", ["ftp://files.example.com/SECRET", "hooks.slack.com/SECRET", "http:///SECRET"])
def test_a_bad_url_is_refused_without_echoing_it(client: httpx.AsyncClient, url: str) -> None:
    with pytest.raises(ValueError, match="http") as raised:
        sink(url, client)
    assert "SECRET" not in str(raised.value)


def test_an_empty_key_or_timeout_is_refused(client: httpx.AsyncClient) -> None:
    with pytest.raises(ValueError, match="HMAC key"):
        sink("https://example.com/x", client, hmac_key=b"")
    with pytest.raises(ValueError, match="timeout"):
        sink("https://example.com/x", client, timeout_s=0)
