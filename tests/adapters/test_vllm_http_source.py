"""The vLLM HTTP source against real loopback servers that answer well, badly, slowly or not at all."""

from __future__ import annotations

import time

import httpx
import pytest

from sidecar.model.health import HealthAnswer, HealthCheck
from sidecar.model.vllm import MetricSchema
from sidecar.sources.fetch import BodyFetcher, HttpxFetcher
from sidecar.sources.vllm_http import HEALTH_MAX_AGE_S, VllmHttpSource
from tests.conftest import EXPOSITIONS
from tests.loopback import LoopbackServer, closed_port, drop_mid_body, endless, respond, slow


@pytest.fixture
def fetcher(client: httpx.AsyncClient) -> BodyFetcher:
    """httpx's; tests/adapters/test_http_get.py runs these scenarios again with the own client's."""
    return HttpxFetcher(client)


CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_bytes()
HEALTHY = {"/version": respond(body=b'{"version":"0.32.0"}'), "/health": respond()}


# 10 s: a read that must succeed has room on a busy 2-core box (CI saw a loopback answer take 1.3 s); the tests of
# the timeout itself pass their own, against a server slower than it.
def source(fetcher: BodyFetcher, url: str, *, timeout_s: float = 10.0, cap: int = 4 * 2**20) -> VllmHttpSource:
    return VllmHttpSource(fetcher=fetcher, base_url=url, timeout_s=timeout_s, max_body_bytes=cap)


async def test_reads_a_real_capture(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=CAPTURE)})
    result = await source(fetcher, server.url + "/").read()
    assert result.ok, result.error
    assert result.value is not None
    assert result.value.version == "0.32.0"
    assert result.value.schema is MetricSchema.V1
    assert result.value.url == server.url
    (engine,) = result.value.engines
    assert (engine.model_name, engine.requests_running, engine.requests_waiting) == ("tiny-llama", 8.0, 4.0)
    assert (await source(fetcher, server.url).health()) == HealthCheck(
        answer=HealthAnswer.OK, detail=f"vLLM {server.url}/health answered HTTP 200"
    )


async def test_missing_version_endpoint_is_not_an_error(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(body=CAPTURE)
    result = await source(fetcher, server.url).read()
    assert result.ok
    assert result.value is not None
    assert result.value.version is None


async def test_vllm_down(fetcher: BodyFetcher) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = await source(fetcher, url).read()
    assert not result.ok
    assert result.error == f"vLLM unreachable at {url}/metrics: connection refused"
    assert result.unreachable  # nothing listens: the process is gone, not failing
    assert (await source(fetcher, url).health()) == HealthCheck(
        answer=HealthAnswer.REFUSED, detail=f"vLLM unreachable at {url}/health: connection refused"
    )


async def test_a_host_name_no_request_can_carry_is_a_line_not_an_exception(fetcher: BodyFetcher) -> None:
    # An A-label the idna package refuses (httpx: "cannot be asked"; Python's own codec takes it, and the name
    # then does not resolve): a one-line error either way, never an exception out of the tick.
    result = await source(fetcher, "http://xn--.invalid").read()
    assert result.error is not None
    assert result.error.startswith("vLLM ")
    assert "http://xn--.invalid/metrics" in result.error
    assert "\n" not in result.error
    assert not result.unreachable


async def test_slower_than_the_timeout(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = slow(3.0, respond(body=CAPTURE))
    started = time.monotonic()
    result = await source(fetcher, server.url, timeout_s=0.5).read()
    assert time.monotonic() - started < 2.0
    assert result.error == f"vLLM {server.url}/metrics did not answer within 0.5 s"
    assert 0.4 < result.duration_s < 2.0


async def test_trickling_body_is_bounded_by_one_deadline(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    # Each chunk arrives well within httpx's per-read timeout; only a whole-request deadline stops this.
    server.routes["/metrics"] = endless(b"vllm:x 1\n", pause_s=0.05)
    started = time.monotonic()
    result = await source(fetcher, server.url, timeout_s=0.5).read()
    assert time.monotonic() - started < 2.0
    assert result.error is not None
    assert "did not answer within 0.5 s" in result.error


async def test_http_500(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(500, b"Internal Server Error")
    result = await source(fetcher, server.url).read()
    assert result.error == f"vLLM {server.url}/metrics answered HTTP 500"
    assert not result.unreachable  # it answered: running, and failing
    assert not result.wrong_server  # vLLM failing, or a proxy before it: nothing says it is not vLLM


async def test_http_404_is_a_server_that_is_not_vllm(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    result = await source(fetcher, server.url).read()  # nothing routed: 404, as from a plain web server
    assert result.error == f"{server.url} answers, but is not vLLM: /metrics answered HTTP 404"
    assert (result.wrong_server, result.unreachable) == (True, False)


async def test_garbage(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(body=b"<html><body>Bad Gateway</body></html>")
    result = await source(fetcher, server.url).read()
    assert result.error is not None
    assert result.error.startswith(
        f"{server.url} answers, but is not vLLM: /metrics is not a Prometheus text exposition: line 1:"
    )


async def test_binary_garbage(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(body=bytes(range(256)))
    result = await source(fetcher, server.url).read()
    assert result.error is not None
    assert "not UTF-8" in result.error


async def test_50_mb_body_with_content_length(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(body=b"vllm:x 1\n" * (50 * 2**20 // 9))
    result = await source(fetcher, server.url, timeout_s=5.0, cap=16 * 2**20).read()
    assert result.error is not None
    assert "exceeds the 16777216 byte cap" in result.error


async def test_50_mb_body_without_content_length(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = endless(b"vllm:x 1\n" * 1000, limit_bytes=50 * 2**20)
    result = await source(fetcher, server.url, timeout_s=5.0, cap=2**20).read()
    assert result.error is not None
    assert "exceeds the 1048576 byte cap" in result.error


async def test_connection_dropped_mid_body(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = drop_mid_body(len(CAPTURE), CAPTURE[: len(CAPTURE) // 2])
    result = await source(fetcher, server.url).read()
    assert result.error is not None
    assert result.error.startswith(f"vLLM {server.url}/metrics dropped the connection mid-answer")


async def test_disable_log_stats_is_a_problem_not_idle(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/metrics"] = respond(body=b'# TYPE python_info gauge\npython_info{version="3.12"} 1\n')
    server.routes["/version"] = respond(body=b'{"version": "0.32.0"}')  # vLLM names itself there all the same
    result = await source(fetcher, server.url).read()
    assert result.ok
    assert result.value is not None
    assert result.value.schema is MetricSchema.NO_VLLM_METRICS
    assert result.value.engines == ()
    assert any("--disable-log-stats" in problem for problem in result.value.problems)


async def test_unhealthy(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/health"] = respond(503)
    health = await source(fetcher, server.url).health()
    assert health.answer is HealthAnswer.FAILING
    assert health.detail == f"vLLM {server.url}/health answered HTTP 503"


async def test_a_server_without_health_is_told_from_one_failing_it(
    server: LoopbackServer, fetcher: BodyFetcher
) -> None:
    # The loopback server answers 404 on a path it has no route for: not vLLM, or a proxy without /health.
    health = await source(fetcher, server.url).health()
    assert health.answer is HealthAnswer.NO_ENDPOINT
    assert health.detail == f"vLLM {server.url}/health answered HTTP 404"


async def test_no_answer_in_time_is_neither_refused_nor_failing(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/health"] = slow(3.0, respond())
    health = await source(fetcher, server.url, timeout_s=0.3).health()
    assert health.answer is HealthAnswer.NO_ANSWER
    assert health.detail == f"vLLM {server.url}/health did not answer within 0.3 s"


async def test_a_200_from_health_stands_a_few_seconds_while_metrics_reads_and_anything_else_is_asked_again(
    server: LoopbackServer, fetcher: BodyFetcher
) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=CAPTURE)})
    now = [1000.0]
    reader = VllmHttpSource(
        fetcher=fetcher, base_url=server.url, timeout_s=10.0, max_body_bytes=4 * 2**20, clock=lambda: now[0]
    )

    async def tick(seconds: float) -> bool:
        now[0] += seconds
        assert (await reader.read()).ok
        return (await reader.health()).ok

    assert [await tick(0), await tick(1), await tick(1)] == [True, True, True]
    asked = server.hits.count("/health")
    assert asked == 1  # asked on the first tick, while nothing had been read yet; then the 200 stood
    assert await tick(HEALTH_MAX_AGE_S)
    assert server.hits.count("/health") == 2
    # The engine dies: seen within HEALTH_MAX_AGE_S, then asked on every tick until it answers 200 again.
    server.routes["/health"] = respond(503)
    answers = [await tick(1) for _ in range(int(HEALTH_MAX_AGE_S) + 3)]
    first_failure = answers.index(False)
    assert first_failure < HEALTH_MAX_AGE_S
    assert not any(answers[first_failure:])
    assert server.hits.count("/health") == 2 + len(answers) - first_failure
    server.routes["/health"] = respond()
    assert await tick(1)
    # A failed /metrics read means /health is asked on the next tick, whatever its last answer.
    asked = server.hits.count("/health")
    server.routes["/metrics"] = respond(500)
    now[0] += 1
    assert not (await reader.read()).ok
    assert (await reader.health()).ok
    assert server.hits.count("/health") == asked + 1


async def test_version_is_asked_once_then_again_after_a_failed_poll(
    server: LoopbackServer, fetcher: BodyFetcher
) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=CAPTURE)})
    reader = source(fetcher, server.url)
    for _ in range(3):
        result = await reader.read()
        assert result.value is not None
        assert result.value.version == "0.32.0"
    assert server.hits.count("/version") == 1
    server.routes["/metrics"] = respond(500)
    assert not (await reader.read()).ok
    server.routes["/metrics"] = respond(body=CAPTURE)
    server.routes["/version"] = respond(body=b'{"version":"0.33.0"}')
    result = await reader.read()
    assert result.value is not None
    assert result.value.version == "0.33.0"  # restarted into a new version: noticed at once
    assert server.hits.count("/version") == 2


async def test_a_version_that_does_not_answer_in_time_is_asked_again_and_not_forgotten(
    server: LoopbackServer, fetcher: BodyFetcher
) -> None:
    """A busy vLLM at start: /version later than the timeout while /metrics answers. The reading carries no version
    then, and the next poll asks again (not a minute later, as when a late answer wiped it: CI run 22)."""
    server.routes.update(HEALTHY, **{"/metrics": respond(body=CAPTURE)})
    server.routes["/version"] = slow(2.0, respond(body=b'{"version":"0.32.0"}'))
    reader = source(fetcher, server.url, timeout_s=0.5)
    first = await reader.read()
    assert first.ok, first.error
    assert first.value is not None
    assert first.value.version is None
    server.routes["/version"] = respond(body=b'{"version":"0.32.0"}')
    second = await reader.read()
    assert second.value is not None
    assert second.value.version == "0.32.0"
    assert server.hits.count("/version") == 2


IDLE = (
    b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
)


async def test_an_idle_reading_asks_load_for_requests_in_flight(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=IDLE), "/load": respond(body=b'{"server_load": 3}')})
    result = await source(fetcher, server.url).read()
    assert result.value is not None
    assert result.value.server_load == 3  # an engine wedged while idle: its gauges read 0, its server has 3 waiting


async def test_load_is_not_asked_under_load_nor_again_where_it_is_not_offered(
    server: LoopbackServer, fetcher: BodyFetcher
) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=CAPTURE)})  # 8 running: the gauges show the work
    reader = source(fetcher, server.url)
    assert (await reader.read()).ok
    assert "/load" not in server.hits
    server.routes["/metrics"] = respond(body=IDLE)  # /load: 404 here, as on vLLM before 0.8 or not vLLM
    for _ in range(3):
        result = await reader.read()
        assert result.value is not None
        assert result.value.server_load is None
    assert server.hits.count("/load") == 1
    server.routes["/metrics"] = respond(500)  # a failed poll may be a restart into a vLLM that has it
    assert not (await reader.read()).ok
    server.routes.update({"/metrics": respond(body=IDLE), "/load": respond(body=b'{"server_load": 0}')})
    result = await reader.read()
    assert result.value is not None
    assert result.value.server_load == 0
    assert server.hits.count("/load") == 2


@pytest.mark.parametrize("body", [b"not json", b'{"server_load": -1}', b'{"server_load": "3"}', b"[[[", b"{}"])
async def test_a_load_answer_that_is_not_a_count_is_no_value(
    server: LoopbackServer, fetcher: BodyFetcher, body: bytes
) -> None:
    server.routes.update(HEALTHY, **{"/metrics": respond(body=IDLE), "/load": respond(body=body)})
    result = await source(fetcher, server.url).read()
    assert result.ok
    assert result.value is not None
    assert result.value.server_load is None
