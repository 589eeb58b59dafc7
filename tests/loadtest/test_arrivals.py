"""The load tester's sending on virtual time (looptime): the open loop's Poisson schedule to the microsecond, its
in-flight cap, and the closed loop's duration, with requests that take a known time and no network. The same
loops against a real server: tests/loadtest/test_against_server.py."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from sidecar.config.tool_settings import load_tool_settings
from sidecar.loadtest.command import LoadtestSettings, add_arguments, build_spec
from sidecar.loadtest.metrics import ServerWatch
from sidecar.loadtest.result import FailureKind, RequestResult
from sidecar.loadtest.runner import _closed_loop, _open_loop, _Tally
from sidecar.loadtest.spec import LoadSpec, PlannedRequest, seeded

pytestmark = pytest.mark.looptime


def spec(*argv: str) -> LoadSpec:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = load_tool_settings(LoadtestSettings, parser.parse_args(["--url", "http://127.0.0.1:1", *argv]))
    return build_spec(settings)


class Server:
    """Answers every request after `answer_s` of loop time; records when each was sent, from the run's start."""

    def __init__(self, answer_s: float) -> None:
        self.answer_s = answer_s
        self.started = asyncio.get_running_loop().time()
        self.sent_s: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def send_one(self, planned: PlannedRequest) -> RequestResult:
        at_s = asyncio.get_running_loop().time() - self.started
        self.sent_s.append(at_s)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.answer_s)
        self.in_flight -= 1
        return RequestResult(
            index=planned.index,
            started_s=at_s,
            duration_s=self.answer_s,
            requested_prompt_tokens=planned.prompt_words,
            requested_output_tokens=planned.max_tokens,
        )


async def test_the_open_loop_sends_every_arrival_at_its_planned_time() -> None:
    run = spec("--rate", "40", "--duration", "3", "--output-tokens", "2")
    arrivals, planned, at = seeded(f"{run.seed}/arrivals"), [], 0.0
    while at < 3:
        planned.append(at)
        at += arrivals.expovariate(40)
    server = Server(answer_s=0.3)  # slower than the mean gap: requests overlap, and the schedule must not care
    tally = _Tally(spec=run, watch=ServerWatch())
    loop = asyncio.get_running_loop()

    sending_s = await _open_loop(
        run, 40, send_one=server.send_one, tally=tally, started=server.started, clock=loop.time
    )

    assert server.sent_s == pytest.approx(planned, abs=1e-6)
    assert tally.max_send_lag_s == pytest.approx(0, abs=1e-6)
    assert sending_s == pytest.approx(3)  # the window ends at the duration, not at the last answer
    assert server.most_in_flight > 1


async def test_the_open_loop_drops_the_arrivals_over_its_in_flight_cap() -> None:
    run = spec("--rate", "200", "--max-requests", "20", "--max-in-flight", "2", "--output-tokens", "6")
    server = Server(answer_s=1.0)  # all 20 arrive in about 0.1 s: the first two are still running
    tally = _Tally(spec=run, watch=ServerWatch())
    loop = asyncio.get_running_loop()

    await _open_loop(run, 200, send_one=server.send_one, tally=tally, started=server.started, clock=loop.time)

    assert (len(server.sent_s), server.most_in_flight, tally.dropped) == (2, 2, 18)
    assert {result.failure for result in tally.results} == {FailureKind.DROPPED_BY_CLIENT}


async def test_the_closed_loop_sends_back_to_back_until_its_duration() -> None:
    run = spec("--concurrency", "2", "--duration", "0.5", "--output-tokens", "5")
    server = Server(answer_s=0.08)
    tally = _Tally(spec=run, watch=ServerWatch())
    loop = asyncio.get_running_loop()

    sending_s = await _closed_loop(
        run, 2, send_one=server.send_one, tally=tally, started=server.started, clock=loop.time
    )

    # each worker sends at 0, 0.08, ..., 0.48 (7 requests), and the last answer ends the run at 0.56 s
    assert len(server.sent_s) == 14
    assert sending_s == pytest.approx(0.56)
    assert server.most_in_flight == 2
