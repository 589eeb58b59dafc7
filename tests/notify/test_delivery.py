"""The notifier with real webhooks on loopback: retries, give-ups, hangs, and no secret in any log line."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import structlog
from structlog.testing import capture_logs

from sidecar.notify.dispatcher import Notifier
from sidecar.notify.message import NotificationKind
from sidecar.notify.payload import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookFormat, verify_signature
from sidecar.notify.sink import NotificationSink
from sidecar.notify.webhook import WebhookSink
from tests.loopback import closed_port
from tests.notify.conftest import ORIGIN, note
from tests.notify.fakes import Sleeps, named
from tests.notify.receiver import HANG, Receiver, Reply

URL_PATH = "/services/T0001/B0002/PathSecretXyz"
URL_QUERY = "token=QuerySecretAbc"
KEY = b"HmacKeySecret-123"


def webhook(base: str, client: httpx.AsyncClient, *, timeout_s: float = 5.0) -> WebhookSink:
    return WebhookSink(f"{base}{URL_PATH}?{URL_QUERY}", client=client, origin=ORIGIN, timeout_s=timeout_s)


def hub(sinks: list[NotificationSink], sleeps: Sleeps, **kwargs: Any) -> Notifier:
    return Notifier(sinks, logger=structlog.get_logger(), sleep=sleeps, **kwargs)


async def test_500_then_200_is_retried_with_backoff(client: httpx.AsyncClient) -> None:
    sleeps = Sleeps()
    async with Receiver([500, 503, 200]) as receiver:
        with capture_logs() as logs:
            notifier = hub([webhook(receiver.url, client)], sleeps, backoff_base_s=1, backoff_max_s=60)
            notifier.start()
            notifier.notify(note())
            await notifier.stop(timeout_s=5)
    assert len(receiver.requests) == 3
    assert len(sleeps.delays) == 2
    assert 0 <= sleeps.delays[0] <= 1.0
    assert 0 <= sleeps.delays[1] <= 2.0
    [delivered] = named(logs, "notification_delivered")
    assert delivered["attempts"] == 3
    assert delivered["sink"] == f"json webhook {receiver.url}/…"


async def test_400_is_permanent_and_not_retried(client: httpx.AsyncClient) -> None:
    sleeps = Sleeps()
    async with Receiver([Reply(400, b"invalid_payload")], default=200) as receiver:
        with capture_logs() as logs:
            notifier = hub([webhook(receiver.url, client)], sleeps)
            notifier.start()
            notifier.notify(note())
            await notifier.stop(timeout_s=5)
    assert len(receiver.requests) == 1
    assert sleeps.delays == []
    [failed] = named(logs, "notification_failed")
    assert failed["permanent"] is True
    assert failed["error"] == "HTTP 400: invalid_payload"


async def test_a_dead_receiver_is_given_up_after_max_attempts_and_logged_once(client: httpx.AsyncClient) -> None:
    sleeps = Sleeps()
    with capture_logs() as logs:
        notifier = hub([webhook(f"http://127.0.0.1:{closed_port()}", client)], sleeps, max_attempts=4)
        notifier.start()
        notifier.notify(note(NotificationKind.RESTART_FAILURE))
        await notifier.stop(timeout_s=5)
    assert len(sleeps.delays) == 3
    [failed] = named(logs, "notification_failed")
    assert failed["attempts"] == 4
    assert failed["permanent"] is False
    assert "Connect" in failed["error"]
    assert len(named(logs, "notification")) == 1


async def test_a_receiver_that_never_answers_delays_neither_notify_nor_another_sink(
    client: httpx.AsyncClient,
) -> None:
    async with Receiver(default=HANG) as stuck, Receiver() as healthy:
        with capture_logs() as logs:
            notifier = hub([webhook(stuck.url, client, timeout_s=30), webhook(healthy.url, client)], Sleeps())
            notifier.start()
            notifier.notify(note(NotificationKind.PAUSE))
            await stuck.wait_for(1)  # the first POST hangs in the stuck receiver now
            started = time.thread_time()  # CPU time: what notify spends itself, whatever the machine's load
            returned = notifier.notify(note(NotificationKind.RESUME))  # type: ignore[func-returns-value]
            spent_s = time.thread_time() - started
            assert returned is None  # a plain call, nothing to await: it queues and returns
            await healthy.wait_for(2, timeout_s=2)
            await notifier.stop(timeout_s=0.1)
    assert spent_s < 0.005
    assert [json.loads(request.body)["kind"] for request in healthy.requests] == ["pause", "resume"]
    undelivered = named(logs, "notification_undelivered")
    assert [line["kind"] for line in undelivered] == ["pause", "resume"]
    assert {line["sink"] for line in undelivered} == {f"json webhook {stuck.url}/…"}


async def test_slack_with_a_signature_end_to_end(client: httpx.AsyncClient) -> None:
    async with Receiver() as receiver:
        sink = WebhookSink(
            receiver.url + "/hook", client=client, origin=ORIGIN, format=WebhookFormat.SLACK, hmac_key=KEY
        )
        notifier = hub([sink], Sleeps())
        notifier.start()
        notifier.notify(note(NotificationKind.RESTART_END, summary="vLLM is back", dry_run=True))
        await notifier.stop(timeout_s=5)
    [request] = receiver.requests
    assert "[dry run] would: vLLM is back" in json.loads(request.body)["text"]
    timestamp = request.headers[TIMESTAMP_HEADER.lower()]
    assert verify_signature(KEY, timestamp, request.body, request.headers[SIGNATURE_HEADER.lower()], now_s=time.time())


async def test_no_secret_in_any_log_line_or_stats(client: httpx.AsyncClient) -> None:
    echo = Reply(404, f"Cannot POST {URL_PATH}?{URL_QUERY}".encode())
    async with (
        Receiver([500, echo]) as echoing,
        Receiver(default=HANG) as stuck,
    ):
        dead = f"http://user:PasswordSecret@127.0.0.1:{closed_port()}"
        sinks: list[NotificationSink] = [
            WebhookSink(f"{echoing.url}{URL_PATH}?{URL_QUERY}", client=client, origin=ORIGIN, hmac_key=KEY),
            WebhookSink(
                f"{dead}{URL_PATH}?{URL_QUERY}",
                client=client,
                origin=ORIGIN,
                format=WebhookFormat.SLACK,
                hmac_key=KEY,
            ),
            WebhookSink(f"{stuck.url}{URL_PATH}?{URL_QUERY}", client=client, origin=ORIGIN, timeout_s=0.05),
        ]
        with capture_logs() as logs:
            notifier = hub(sinks, Sleeps(), max_attempts=2, queue_size=1)
            notifier.start()
            for kind in NotificationKind:
                notifier.notify(note(kind))
            await asyncio.sleep(0.2)
            stats = notifier.stats()
            await notifier.stop(timeout_s=0.05)
    events = {line["event"] for line in logs}
    assert {"notification", "notification_dropped", "notification_failed", "notification_retrying"} <= events
    assert any("Cannot POST" in line.get("error", "") for line in logs)  # the echo was logged, scrubbed
    rendered = json.dumps(logs, default=str) + repr(logs) + repr(stats) + "".join(repr(sink) for sink in sinks)
    for secret in ("PathSecretXyz", "QuerySecretAbc", "PasswordSecret", URL_PATH, KEY.decode(), KEY.hex()):
        assert secret not in rendered
