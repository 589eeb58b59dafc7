"""The load test end to end against a real loopback OpenAI-like server: streaming, failures, a slow
server, a server that dies, the arrival modes, shared prefixes, the JSON report and bad arguments."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.loadtest import client, command
from sidecar.loadtest.command import add_arguments, run
from sidecar.loadtest.runner import run_load
from sidecar.loadtest.spec import Api, PlannedRequest, seeded
from tests.loadtest.fake_openai import Behaviour, FakeOpenAI
from tests.loopback import closed_port


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm-sidecar loadtest")
    add_arguments(parser)
    return parser.parse_args(argv)


def loadtest(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, *argv: str) -> tuple[int, dict[str, Any]]:
    code = run(parse(["--url", fake.url, "--json", *argv]))
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)


def test_all_ok_passes_with_sane_numbers(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.token_delay_s = 0.005
    code, report = loadtest(
        capsys, fake, "--concurrency", "4", "--max-requests", "24", "--prompt-tokens", "30", "--output-tokens", "10"
    )
    assert code == 0
    assert report["verdict"] == "PASS"
    assert report["requests"] | {"failures": None} == {
        "total": 24,
        "sent": 24,
        "succeeded": 24,
        "failed": 0,
        "error_ratio": 0.0,
        "stopped_early": False,
        "failures": None,
        "first_errors": {},
        "http_status_codes": {},
    }
    throughput = report["throughput"]
    assert (throughput["output_tokens"], throughput["prompt_tokens"], throughput["token_source"]) == (240, 720, "usage")
    assert throughput["output_tokens_per_s"] == pytest.approx(240 / report["duration_s"])
    assert throughput["total_tokens_per_s"] == pytest.approx(960 / report["duration_s"])
    ttft, e2e = report["latency_s"]["ttft"], report["latency_s"]["e2e"]
    assert 0 < ttft["p50"] <= ttft["p95"] <= ttft["p99"] < 2
    assert 0 < e2e["p50"] <= e2e["p95"] <= e2e["p99"] < 2
    # Each request's first token comes before its last, so each percentile of one is below the other's. (Not
    # every TTFT below the median e2e: one first token late on a busy machine is not a fault.)
    for percentile in ("p50", "p95", "p99"):
        assert ttft[percentile] < e2e[percentile]
    assert e2e["p50"] >= 9 * 0.005  # nine pauses between ten tokens
    assert report["server"].pop("metrics_readings") >= 1  # a poll at the start at least
    assert report["server"] == {
        "metrics_available": True,
        "peak_kv_cache_usage_ratio": 0.42,
        "preemptions": 0.0,
        "died": False,
        "died_at_s": None,
        "died_reason": None,
    }
    assert report["target"] == {"url": fake.url, "api": "completions", "model": "fake-model", "max_model_len": 4096}
    body = fake.seen.bodies[0]
    assert (body["model"], body["max_tokens"], body["stream"], body["ignore_eos"]) == ("fake-model", 10, True, True)
    assert body["stream_options"] == {"include_usage": True}


def test_text_report_and_chat_api(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    code = run(parse(["--url", fake.url, "--api", "chat", "--concurrency", "2", "--max-requests", "6"]))
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"loadtest of {fake.url} (chat API, model fake-model, max_model_len 4096)"
    assert "requests:     6 total, 6 sent, 6 ok, 0 failed" in lines
    assert any(line.startswith("TTFT:         p50 ") for line in lines)
    assert lines[-1].startswith("verdict: PASS - 6/6 ok, p99 e2e ")
    assert lines[-1].endswith(", peak KV 0.42, 0 preemptions")
    assert "messages" in fake.seen.bodies[0]


def test_server_errors_are_counted_and_fail_over_the_error_rate(
    capsys: pytest.CaptureFixture[str], fake: FakeOpenAI
) -> None:
    fake.behaviour.fail_every = 4
    code, report = loadtest(capsys, fake, "--concurrency", "2", "--max-requests", "20", "--output-tokens", "3")
    assert code == 1
    assert report["requests"]["failures"]["http_5xx"] == 5
    assert report["requests"]["http_status_codes"] == {"500": 5}
    assert set(report["requests"]["first_errors"]) == {"http_5xx"}  # what the first one said, for the reader
    assert report["requests"]["first_errors"]["http_5xx"]
    assert report["requests"]["succeeded"] == 15
    assert report["server"]["died"] is False
    assert report["verdict_line"] == ("verdict: FAIL - 5 of 20 requests failed (25.0% > 1.0% allowed): http_5xx 5")
    assert fake.seen.requests == 20  # nothing retried
    code, report = loadtest(
        capsys, fake, "--concurrency", "2", "--max-requests", "20", "--output-tokens", "3", "--max-error-rate", "0.3"
    )
    assert (code, report["verdict"]) == (0, "PASS")


def test_a_server_killed_mid_run_died_and_when(
    capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.behaviour.token_delay_s = 0.02
    fake.behaviour.die_at_request = 8  # by count, not by a timer: a busy machine cannot move it
    readings: list[float] = []

    def clock() -> float:
        readings.append(time.monotonic())
        return readings[-1]

    monkeypatch.setattr(command, "run_load", functools.partial(run_load, clock=clock))
    code, report = loadtest(capsys, fake, "--rate", "20", "--duration", "60", "--output-tokens", "20")
    assert code == 1
    server = report["server"]
    assert server["died"] is True
    assert fake.killed_at_s is not None
    run_started = readings[0]  # run_load's first reading of its clock is the run's start
    # seen dead after the kill, and before the run, cut short by the death, ended
    assert fake.killed_at_s - run_started <= server["died_at_s"] <= report["duration_s"] < 60
    assert server["died_reason"] in {"connection refused", "connection reset"}
    failures = report["requests"]["failures"]
    assert failures["connection_refused"] + failures["connection_reset"] == report["requests"]["failed"] > 0
    assert report["verdict_line"].startswith(f"verdict: FAIL - server died {server['died_at_s']:.1f} s into the run")
    assert report["requests"]["stopped_early"] is True  # once refused, nothing more was sent
    # Refused: the arrivals already on their way when the first refusal came back (a stalled loop launches the
    # overdue ones together: CI saw 4). A run that kept sending would have hundreds more at 20 a second.
    assert 1 <= failures["connection_refused"] <= 10


def test_a_server_that_closes_idle_connections_is_not_judged_dead(
    capsys: pytest.CaptureFixture[str], fake: FakeOpenAI
) -> None:  # the requests' own connections: the next test
    # The server closes, unanswered, any request on a connection idle for 0.6 s: the monitor's once-a-second
    # polls would all meet that close on a kept-alive connection, and read it as a server that died.
    fake.behaviour.idle_close_s = 0.6
    fake.behaviour.token_delay_s = 0.01
    _, report = loadtest(capsys, fake, "--concurrency", "2", "--duration", "3", "--output-tokens", "5")
    server = report["server"]
    assert (server["died"], server["died_reason"]) == (False, None), report["verdict_line"]
    assert server["peak_kv_cache_usage_ratio"] == 0.42  # the polls were answered


async def test_idle_request_connections_are_dropped_before_the_server_closes_them(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM closes connections idle for 5 s and the client drops them after KEEPALIVE_EXPIRY_S; scaled down here
    # (0.6 s and 0.2 s), a request sent after a 0.9 s pause goes on a new connection and is answered.
    fake.behaviour.idle_close_s = 0.6
    monkeypatch.setattr(client, "KEEPALIVE_EXPIRY_S", 0.2)
    target = client.Target(base_url=fake.url, api=Api.COMPLETIONS, model="fake-model", timeout_s=10)
    results = []
    async with client.ClientShards(connections=1, timeout_s=10) as shards, shards.lease() as http:
        for index in range(2):
            planned = PlannedRequest(index=index, prompt="a b c", max_tokens=3, prompt_words=3, prefix_group=None)
            results.append(await client.send(http, target, planned, run_started=time.monotonic()))
            await asyncio.sleep(0.9)
    assert [result.failure for result in results] == [None, None], results
    assert fake.seen.dropped_on_idle == 0


def test_a_closed_loop_stops_sending_to_a_dead_server(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.token_delay_s = 0.02
    fake.behaviour.die_at_request = 20
    code, report = loadtest(capsys, fake, "--concurrency", "4", "--max-requests", "100000", "--output-tokens", "5")
    assert code == 1
    assert report["server"]["died"] is True
    assert report["requests"]["stopped_early"] is True
    assert report["requests"]["failures"]["connection_refused"] <= 4  # one per worker at most
    # of 100000: the 20 the server saw, and per worker at most one more cut in the accept queue and one refused
    assert report["requests"]["sent"] <= 20 + 2 * 4


def test_a_slow_server_times_out(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.first_token_delay_s = 5.0
    code, report = loadtest(capsys, fake, "--concurrency", "3", "--max-requests", "3", "--timeout", "0.4")
    assert code == 1
    assert report["requests"]["failures"]["timeout"] == 3
    assert report["duration_s"] < 1.5
    assert report["latency_s"]["e2e"]["p50"] is None
    assert report["server"]["died"] is False


@pytest.mark.parametrize(
    ("behaviour", "kind", "error"),
    [
        (Behaviour(error_after_tokens=2), "http_5xx", {"500": 2}),
        (Behaviour(garbage=True), "protocol", {}),
    ],
)
def test_broken_answers_are_counted_by_kind(
    behaviour: Behaviour, kind: str, error: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeOpenAI(behaviour)
    try:
        code, report = loadtest(capsys, server, "--concurrency", "2", "--max-requests", "2", "--output-tokens", "4")
    finally:
        server.close()
    assert code == 1
    assert report["requests"]["failures"][kind] == 2
    assert report["requests"]["http_status_codes"] == error
    assert report["server"]["died"] is False


def test_tokens_with_unicode_line_separators_are_read_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped, and vLLM writes them so; they end no SSE line.
    (httpx's aiter_lines() split there, and a tiny model's random token failed a request in CI as a 'protocol'
    error.)"""
    server = FakeOpenAI(Behaviour(piece_text=" a\u2028b\u2029c\x85d"))
    try:
        code, report = loadtest(capsys, server, "--concurrency", "2", "--max-requests", "4", "--output-tokens", "4")
    finally:
        server.close()
    assert (code, report["requests"]["succeeded"], report["requests"]["failed"]) == (0, 4, 0), report["requests"]


def test_closed_loop_never_exceeds_its_concurrency(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.token_delay_s = 0.02
    # 20 workers: more than one of the client's connection pools (16 each), none of which may queue a request.
    # The server answers once 20 are in (CI run 46 saw 17 overlap by chance on a starved box, with none queued).
    fake.behaviour.hold_until_in_flight = 20
    code, report = loadtest(capsys, fake, "--concurrency", "20", "--max-requests", "60", "--output-tokens", "5")
    assert code == 0
    assert fake.seen.max_in_flight == 20
    assert fake.seen.requests == 60
    assert report["load"]["mode"] == "closed_loop"


def test_closed_loop_stops_at_its_duration(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.token_delay_s = 0.02
    code, report = loadtest(capsys, fake, "--concurrency", "2", "--duration", "0.5", "--output-tokens", "5")
    assert code == 0
    assert report["duration_s"] >= 0.5  # how many it sends in that time: test_arrivals.py, on virtual time
    assert fake.seen.requests == report["requests"]["sent"] >= 2


def test_open_loop_keeps_its_poisson_schedule(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    rate, duration = 40.0, 1.0
    arrivals, expected, at = seeded("0/arrivals"), [], 0.0
    while at < duration:
        expected.append(at)
        at += arrivals.expovariate(rate)
    code, report = loadtest(capsys, fake, "--rate", str(rate), "--duration", str(duration), "--output-tokens", "2")
    assert code == 0
    # every planned arrival reached the server; that each is sent at its planned time is tested to the
    # microsecond on virtual time (test_arrivals.py), where a busy machine cannot blur it
    assert fake.seen.requests == report["requests"]["sent"] == len(expected)
    assert report["throughput"]["requests_per_s"] == pytest.approx(len(expected) / report["sending_s"])
    assert report["max_send_lag_s"] >= 0


def test_open_loop_drops_arrivals_over_the_in_flight_cap(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    fake.behaviour.token_delay_s = 0.05
    code, report = loadtest(
        capsys, fake, "--rate", "200", "--max-requests", "20", "--max-in-flight", "2", "--output-tokens", "6"
    )
    assert code == 1
    requests = report["requests"]
    assert fake.seen.max_in_flight <= 2
    assert requests["failures"]["dropped_by_client"] == 20 - requests["sent"] > 10
    assert fake.seen.requests == requests["sent"]


def test_shared_prefixes_reach_the_server(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI) -> None:
    code, _ = loadtest(
        capsys,
        fake,
        *("--concurrency", "4", "--max-requests", "20", "--prompt-tokens", "16", "--output-tokens", "2"),
        *("--shared-prefix-ratio", "0.25", "--shared-prefixes", "2", "--shared-prefix-tokens", "8"),
    )
    assert code == 0
    heads = Counter(" ".join(prompt.split()[:8]) for prompt in fake.seen.prompts)
    shared = {head: count for head, count in heads.items() if count > 1}
    assert sorted(shared.values()) == [2, 3]  # 5 of 20 requests, spread over 2 prefixes
    first_words = [prompt.split()[0] for prompt in fake.seen.prompts]
    assert len(set(first_words)) == 15 + 2  # the rest unique from their first word
    assert all(len(prompt.split()) == 16 for prompt in fake.seen.prompts)


def test_pressure_on_the_server_warns(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeOpenAI(Behaviour(kv_usage_ratio=0.97, preemptions_per_request=1))
    try:
        code, report = loadtest(capsys, server, "--concurrency", "2", "--max-requests", "6", "--output-tokens", "2")
    finally:
        server.close()
    assert code == 0
    assert report["verdict"] == "WARN"
    assert report["server"]["preemptions"] == 6.0  # the 5 from before the run are not counted
    assert report["server"]["peak_kv_cache_usage_ratio"] == 0.97


def test_a_server_without_metrics_or_streaming(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeOpenAI(Behaviour(metrics=False, stream=False))
    try:
        code, report = loadtest(capsys, server, "--concurrency", "2", "--max-requests", "4", "--output-tokens", "2")
    finally:
        server.close()
    assert code == 0
    assert report["server"]["metrics_available"] is False
    assert report["server"]["peak_kv_cache_usage_ratio"] is None
    assert report["server"]["preemptions"] is None
    assert report["latency_s"]["ttft"]["p50"] is None
    assert report["latency_s"]["e2e"]["p50"] is not None
    assert report["verdict_line"].endswith("peak KV not available, preemptions not available")


def test_prompts_file(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one two three", "max_tokens": 2}\n{"prompt": "four five"}\n')
    code, report = loadtest(
        capsys,
        fake,
        "--concurrency",
        "1",
        "--max-requests",
        "4",
        "--prompts-file",
        str(prompts),
        "--output-tokens",
        "3",
    )
    assert code == 0
    assert fake.seen.prompts == ["one two three", "four five"] * 2
    assert [body["max_tokens"] for body in fake.seen.bodies] == [2, 3, 2, 3]
    assert report["throughput"]["prompt_tokens"] == 10


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--rate", "1", "--concurrency", "2", "--max-requests", "1"], "exactly one of --rate (open loop) and"),
        (["--concurrency", "two", "--max-requests", "1"], "invalid setting concurrency='two'"),
        (["--concurrency", "1", "--max-requests", "1", "--api", "embeddings"], "invalid choice: 'embeddings'"),
    ],
)
def test_flags_that_cannot_be_read_exit_2_with_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str], fake: FakeOpenAI
) -> None:
    try:
        code = main(["loadtest", "--url", fake.url, *argv])
    except SystemExit as stopped:  # refused by the parser (a value outside the choices)
        code = int(str(stopped.code))
    out, err = capsys.readouterr()
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert error in err
    assert fake.seen.requests == 0


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--concurrency", "1"], "--duration and/or --max-requests"),
        (["--max-requests", "1"], "exactly one of --rate (open loop) and --concurrency (closed loop)"),
        (["--concurrency", "1", "--max-requests", "1", "--prompt-tokens", "uniform:9-3"], "MIN <= MAX"),
        (["--rate", "-1", "--max-requests", "1"], "--rate must be > 0"),
        (
            ["--concurrency", "1", "--max-requests", "1", "--prompt-tokens", "4000"],
            "exceeds the server's max_model_len",
        ),
        (["--concurrency", "1", "--max-requests", "1", "--model", "other"], "'other' is not served"),
        (["--concurrency", "1", "--max-requests", "1", "--prompts-file", "/nonexistent.jsonl"], "--prompts-file"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str], fake: FakeOpenAI
) -> None:
    assert run(parse(["--url", fake.url, *argv])) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("vllm-sidecar: error: ")
    assert error in err
    assert fake.seen.requests == 0


def test_an_unreachable_server_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    assert run(parse(["--url", url, "--concurrency", "1", "--max-requests", "1"])) == 2
    _, err = capsys.readouterr()
    assert err == f"vllm-sidecar: error: cannot reach {url}/v1/models: connection refused\n"
    assert err.count("\n") == 1
