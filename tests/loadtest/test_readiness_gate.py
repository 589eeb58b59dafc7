"""`--readiness-url`: the load tester sends only while the gate answers 200, as a Service or router would."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.loadtest.fake_openai import FakeOpenAI
from tests.loadtest.test_against_server import parse
from tests.loopback import LoopbackServer, respond


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def gate() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    yield server
    server.close()


def _run(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, gate: LoopbackServer) -> dict[str, object]:
    from sidecar.loadtest.command import run

    argv = ["--url", fake.url, "--json", "--concurrency", "4", "--duration", "1.5", "--prompt-tokens", "20"]
    run(parse([*argv, "--output-tokens", "4", "--readiness-url", gate.url + "/readyz"]))
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


def test_a_closed_gate_sends_nothing(
    capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, gate: LoopbackServer
) -> None:
    gate.routes["/readyz"] = respond(503, b"paused: KV cache usage 0.93 >= 0.90")
    report = _run(capsys, fake, gate)
    requests = report["requests"]
    assert isinstance(requests, dict)
    assert fake.seen.requests == 0
    assert requests["succeeded"] == 0
    failures = requests["failures"]
    assert isinstance(failures, dict)
    assert {kind for kind, count in failures.items() if count} == {"not_ready"}


def test_an_open_gate_sends(capsys: pytest.CaptureFixture[str], fake: FakeOpenAI, gate: LoopbackServer) -> None:
    gate.routes["/readyz"] = respond(200, b"ready")
    report = _run(capsys, fake, gate)
    requests = report["requests"]
    assert isinstance(requests, dict)
    assert fake.seen.requests > 0
    assert requests["failed"] == 0
