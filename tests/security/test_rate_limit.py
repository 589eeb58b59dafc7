"""Rate limits of the admin API: the token buckets on a fake clock, then the real daemon over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.exporter.rate_limit import AdminRateLimiter, RateLimit, client_key, parse_rate_limit
from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, respond

TOKEN = "rate-limit-test-admin-token-0123"  # noqa: S105 - a test fixture, not a secret


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.parametrize(
    ("text", "requests", "period_s"),
    [
        ("10/min", 10, 60.0),
        ("5/s", 5, 1.0),
        ("100/h", 100, 3600.0),
        ("20/30s", 20, 30.0),
        (" 3 / 2 minutes ", 3, 120.0),
        ("1/hour", 1, 3600.0),
        ("10000/24h", 10000, 86400.0),
    ],
)
def test_rate_limits_that_parse(text: str, requests: int, period_s: float) -> None:
    assert parse_rate_limit(text) == RateLimit(requests=requests, period_s=period_s)


@pytest.mark.parametrize(
    "text", ["", "10", "0/min", "10/0s", "10/fortnight", "10001/s", "1/25h", "-1/min", "ten/min", "10/min/extra"]
)
def test_rate_limits_that_do_not(text: str) -> None:
    with pytest.raises(ValueError, match=r"REQUESTS/PERIOD|must be"):
        parse_rate_limit(text)


def test_a_client_gets_its_burst_then_429_until_a_token_is_back() -> None:
    clock = Clock()
    limiter = AdminRateLimiter(RateLimit(requests=3, period_s=60.0), clock=clock)
    assert [limiter.admit("10.0.0.1:5000").allowed for _ in range(3)] == [True, True, True]
    refused = limiter.admit("10.0.0.1:5001")  # another source port of the same host: the same bucket
    assert (refused.allowed, refused.retry_after_s, refused.first_refusal) == (False, 20, True)
    assert limiter.admit("10.0.0.1:5002").first_refusal is False  # logged once per episode, not per request
    clock.now_s += 19.0
    assert limiter.admit("10.0.0.1:5003").retry_after_s == 1
    clock.now_s += 1.5
    assert limiter.admit("10.0.0.1:5004").allowed
    assert not limiter.admit("10.0.0.1:5005").allowed
    assert limiter.admit("10.0.0.2:5000").allowed  # another client has its own bucket


def test_all_clients_together_are_capped_at_four_times_one_client() -> None:
    clock = Clock()
    limiter = AdminRateLimiter(RateLimit(requests=2, period_s=60.0), clock=clock)
    allowed = [limiter.admit(f"10.0.{index}.1:4000").allowed for index in range(20)]
    assert allowed.count(True) == 8
    assert allowed[:8] == [True] * 8
    refused = limiter.admit("10.9.9.9:4000")
    assert not refused.allowed
    assert refused.retry_after_s == 8  # one shared token comes back every 60 / (2 x 4) = 7.5 s


def test_ipv6_clients_are_counted_per_64_and_the_table_stays_bounded() -> None:
    assert client_key("2001:db8:1:2:aaaa::1:443") == client_key("2001:db8:1:2:bbbb::9:443") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1:443") != client_key("2001:db8:1:2::1:443")
    assert client_key("::ffff:10.1.2.3:80") == "10.1.2.3"
    assert client_key("127.0.0.1:9999") == "127.0.0.1"
    clock = Clock()
    limiter = AdminRateLimiter(RateLimit(requests=1, period_s=1.0), max_clients=16, clock=clock)
    for index in range(1000):
        clock.now_s += 1.0
        limiter.admit(f"10.{index // 256}.{index % 256}.1:1")
    assert len(limiter._clients) == 16  # a scan over many addresses costs a bounded table


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    capture = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_bytes()
    server.routes.update({"/metrics": respond(body=capture), "/health": respond(), "/version": respond(404)})
    yield server
    server.close()


def test_the_daemon_answers_429_to_a_token_guesser_and_never_to_probes(vllm: LoopbackServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    sidecar = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--state-dir", str(tmp_path),
         "--admin-token-file", str(token_file), "--admin-rate-limit", "3/min"],
        tmp_path / "log",
    )  # fmt: skip
    try:
        sidecar.wait_ready()
        with httpx.Client(base_url=sidecar.url, timeout=5) as client:
            guesses = [
                client.post("/admin/restart", headers={"Authorization": f"Bearer guess-{n:020d}"}) for n in range(6)
            ]
            assert [answer.status_code for answer in guesses] == [403, 403, 403, 429, 429, 429]
            assert 1 <= int(guesses[3].headers["retry-after"]) <= 20
            # Holding the right token now does not help this client until its bucket refills.
            assert client.post("/admin/pause", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 429
            probes = [client.get(path).status_code for path in ("/metrics", "/healthz", "/readyz", "/status") * 25]
            assert set(probes) == {200}
    finally:
        sidecar.kill()
    events = sidecar.events()
    assert [event["status"] for event in events if event["event"] == "admin_refused"] == [403, 403, 403]
    limited = [event for event in events if event["event"] == "admin_rate_limited"]
    assert len(limited) == 1
    assert str(limited[0]["caller"]).startswith("127.0.0.1:")
    assert not [event for event in events if event["event"] == "admin_action"]  # nothing was paused or restarted
