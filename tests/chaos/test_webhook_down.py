"""The webhook receiver down: notifications are retried and delivered once it is back, in order and once each;
while it stays down the queue bound holds (the oldest waiting ones go, each logged), and polling never waits.

Notifications are made with the admin API (a manual pause, a manual resume: one notification each), which is
the only way to make a hundred of them in a second. The daemon is real; so is the receiver, on loopback, on
a port that is closed (connection refused) while it is "down".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from sidecar.notify.dispatcher import Notifier
from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.sink import DeliveryResult, DeliveryStatus
from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port

from .chaos import VllmStandIn, assert_survived, counter_watch, named, read_events, scrape, value, wait_until

TOKEN = "chaos-admin-token-0123456789"  # noqa: S105 - a test fixture, not a secret
QUEUE_SIZE = 100  # the daemon's notification queue per sink
OUTAGE_S = 6.0  # as long as much of the old 5-attempt schedule (at most 15 s, about 7.5 s on average)


class Receiver:
    """Records every POST's `kind` on a fixed port; `start` and `stop` take it up and down (refused when down)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.kinds: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.kinds.append(str(json.loads(body)["kind"]))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def received(self) -> list[str]:
        with self._lock:
            return list(self.kinds)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[SidecarProcess, Receiver]]:
    vllm = VllmStandIn(running=2.0)
    receiver = Receiver(closed_port())
    token = tmp_path / "token"
    token.write_text(TOKEN)
    sidecar = SidecarProcess(
        [
            *("--vllm-url", vllm.url, "--gpu-source", "none", "--interval", "0.5"),
            *("--state-dir", str(tmp_path / "state"), "--admin-token-file", str(token)),
            *("--webhook-url", f"http://127.0.0.1:{receiver.port}/hooks/chaos"),
        ],
        tmp_path / "sidecar.log",
        # Only read by daemons whose admin API has a rate limit: a hundred calls a second are this test's point.
        env={"VLLM_SIDECAR_ADMIN_RATE_LIMIT": "10000/s"},
    )
    try:
        sidecar.wait_ready()
        yield sidecar, receiver
    finally:
        sidecar.kill()
        receiver.stop()
        vllm.close()


def _admin(sidecar: SidecarProcess, action: str) -> None:
    answer = httpx.post(sidecar.url + f"/admin/{action}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert answer.status_code == 200, answer.text


def test_notifications_wait_out_a_dead_receiver_and_arrive_once_in_order(
    rig: tuple[SidecarProcess, Receiver],
) -> None:
    sidecar, receiver = rig
    with counter_watch(sidecar) as watch:
        # Down: the pause and the resume wait, retried, while polling goes on.
        _admin(sidecar, "pause")
        down_at = time.monotonic()
        time.sleep(OUTAGE_S / 2)
        _admin(sidecar, "resume")
        time.sleep(OUTAGE_S / 2)
        polled = value(scrape(sidecar), "vllm_sidecar_up")
        healthz = sidecar.get("/healthz").status_code
        receiver.start()
        up_at = time.monotonic()
        wait_until(lambda: len(receiver.received()) >= 2, 40, "both notifications at the receiver once it is up")
        delivered_s = time.monotonic() - up_at
        time.sleep(1.0)  # nothing more may arrive: each notification exactly once
        first = receiver.received()

        # Down again, and more notifications than the queue holds: the oldest waiting ones are dropped, logged.
        receiver.stop()
        offset = len(read_events(sidecar.log_path))
        for _ in range((QUEUE_SIZE + 20) // 2):
            _admin(sidecar, "pause")
            _admin(sidecar, "resume")
        burst = [e for e in read_events(sidecar.log_path)[offset:] if e["event"] == "notification"]
        receiver.start()
        expected_delivered = 1 + QUEUE_SIZE  # the one in flight, and the queue's worth of the newest
        wait_until(
            lambda: len(receiver.received()) >= len(first) + expected_delivered,
            40,
            "the queue to drain into the receiver",
            lambda: f"\ngot {len(receiver.received()) - len(first)}",
        )
        time.sleep(1.0)
        second = receiver.received()[len(first) :]
    watch.assert_monotonic()
    assert_survived(sidecar)
    events = read_events(sidecar.log_path)

    assert (polled, healthz) == (1.0, 200), "a dead webhook must not stall polling"
    assert first == ["pause", "resume"], first
    assert named(events[:offset], "notification_failed") == []
    retried = named(events[:offset], "notification_delivered")
    assert [e["kind"] for e in retried] == ["pause", "resume"]
    assert int(str(retried[0]["attempts"])) >= 2, retried

    kinds = [str(e["kind"]) for e in burst]
    assert len(kinds) == QUEUE_SIZE + 20
    dropped = [str(e["kind"]) for e in named(events[offset:], "notification_dropped")]
    assert len(dropped) == len(kinds) - expected_delivered, dropped
    assert all(e["queue_size"] == QUEUE_SIZE for e in named(events[offset:], "notification_dropped"))
    # Delivered: the first (in flight when the rest arrived) and the newest QUEUE_SIZE, in order, once each.
    assert second == kinds[:1] + kinds[len(dropped) + 1 :], second
    assert dropped == kinds[1 : len(dropped) + 1]
    assert named(events[offset:], "notification_failed") == []
    print(
        f"\nwebhook down {up_at - down_at:.1f} s: both notifications delivered {delivered_s:.1f} s after it came back"
    )


class _DownFor:
    """A sink that fails retryably for its first `failures` attempts, then delivers."""

    name = "down-for-a-while"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0
        self.delivered: list[Notification] = []

    async def send(self, notification: Notification) -> DeliveryResult:
        self.attempts += 1
        if self.attempts <= self.failures:
            return DeliveryResult(status=DeliveryStatus.RETRYABLE, detail="connection refused", duration_s=0.0)
        self.delivered.append(notification)
        return DeliveryResult(status=DeliveryStatus.DELIVERED, detail="HTTP 204", duration_s=0.0)


async def test_with_the_daemons_defaults_a_long_outage_still_ends_in_delivery() -> None:
    # The regression behind the test above, deterministic: 12 failed attempts, 3.5 minutes of backoff with the
    # daemon's defaults (half of each cap here), where the old five-attempt limit gave up after at most 15 s.
    sink = _DownFor(failures=12)
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    failure = Notification(
        kind=NotificationKind.RESTART_FAILURE, summary="restart failed", reason="engine_dead", wall_time_s=0
    )
    with capture_logs() as logs:
        notifier = Notifier([sink], logger=structlog.get_logger(), sleep=sleep, jitter=lambda: 0.5)
        notifier.start()
        notifier.notify(failure)
        await notifier.stop(timeout_s=2)
    assert [n.kind for n in sink.delivered] == [NotificationKind.RESTART_FAILURE]
    assert sink.attempts == 13
    assert sum(waited) == pytest.approx(211.5)
    assert [line for line in logs if line["event"] == "notification_failed"] == []
