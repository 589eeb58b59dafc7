"""The two wedges `/health` does not show: requests queued with 0 running (`hang-queue`) and an engine stopped
while idle, its metrics frozen at idle (`hang-idle`). On the simulation's own clock, then once over HTTP.

A sidecar's active probe is one completion with max_tokens=1: it must hang on a wedged engine and complete at
once on a healthy one.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import httpx
import pytest

from sidecar.sim.config import SimConfig, scenario_config
from sidecar.sim.scenarios import scenario_load
from sidecar.sim.server import SimServer
from sidecar.sim.simulation import Simulation
from tests.sim.driver import ListRecorder, Run, drive

PROBE_PROMPT = tuple(range(1000, 1008))


def _probe(sim: Simulation, recorder: ListRecorder, start_s: float, for_s: float) -> float | None:
    """Send a max_tokens=1 completion at `start_s` and step for up to `for_s`; when it finished (None: never)."""
    done = len(recorder.finished)
    sim.add_request("probe", PROBE_PROMPT, 1, start_s)
    now = start_s
    while now < start_s + for_s:
        outcome = sim.step(now)
        if any(event.request_id == "probe" and event.finished for event in outcome.tokens):
            return now - start_s
        now += outcome.duration_s
    assert len(recorder.finished) == done
    return None


def test_a_probe_completes_at_once_on_a_healthy_engine() -> None:
    recorder = ListRecorder()
    sim = Simulation(scenario_config("healthy"), recorder)
    took = _probe(sim, recorder, 0.0, 60.0)
    assert took is not None
    assert took < 0.1, "one step: a prefill of 8 tokens and one sampled token"
    assert recorder.finished[-1].generation_tokens == 1


def test_hang_queue_keeps_requests_waiting_with_none_running_and_counters_frozen() -> None:
    run = drive(scenario_config("hang-queue"), scenario_load("hang-queue"), until_s=60.0)
    before = [s for s in run.samples if s.t < 20.0]
    assert all(s.waiting == 0 for s in before[2:]), "healthy until the wedge: nothing queues"
    assert before[-1].running == 16
    wedged = [s for s in run.samples if s.t >= 25.0]
    assert all(s.running == 0 for s in wedged), "the requests running at 20 s finished; nothing was admitted"
    assert all(s.waiting == 16 for s in wedged), "every request the load sent since waits"
    assert len({(s.generation_tokens, s.finished) for s in wedged}) == 1, "token and request counters frozen"
    assert run.hung_s is None, "the engine loop itself runs on"
    assert not run.sim.admitting
    steps = len(run.recorder.steps)
    gauges = run.sim.engine_gauges()[0]
    run.sim.add_request("late", PROBE_PROMPT, 1, 60.0)
    assert run.sim.engine_gauges()[0].waiting == gauges.waiting + 1, "the waiting gauge grows as requests arrive"
    assert _probe(run.sim, run.recorder, 60.0, 120.0) is None, "a max_tokens=1 probe hangs"
    assert len(run.recorder.steps) == steps, "no iteration ran: the iteration counters stay frozen"
    assert run.sim.abort("late", 700.0), "the engine loop is alive: an abort still frees a waiting request"


def test_hang_queue_starts_at_its_configured_time_even_without_load() -> None:
    recorder = ListRecorder()
    sim = Simulation(scenario_config("hang-queue", hang_queue_after_s=5.0), recorder)
    sim.step(0.0)
    assert _probe(sim, recorder, 1.0, 1.0) is not None, "admitting before the wedge"
    sim.step(5.0)
    assert _probe(sim, recorder, 5.0, 120.0) is None
    assert sim.engine_gauges()[0].waiting == 1
    assert sim.engine_gauges()[0].running == 0


def _hang_idle(until_s: float, **overrides: object) -> Run:
    return drive(scenario_config("hang-idle", **overrides), scenario_load("hang-idle"), until_s=until_s)


def test_hang_idle_stops_the_engine_at_its_first_idle_moment_and_freezes_metrics_at_idle() -> None:
    run = _hang_idle(60.0)
    assert run.hung_s is not None
    assert 20.0 <= run.hung_s < 25.0, "the lull begins at 20 s; the requests in flight then finish first"
    assert run.sim.stopped_idle
    after = [s for s in run.samples if s.t > run.hung_s]
    assert after[-1].t > 30.0, "the load came back after its lull and sent requests to the stopped engine"
    assert all((s.running, s.waiting) == (0, 0) for s in after), "metrics frozen at idle"
    assert len({(s.generation_tokens, s.finished) for s in after}) == 1, "counters frozen"
    assert run.sim.has_work, "yet the requests sent after the lull are inside, never answered"
    assert _probe(run.sim, run.recorder, 60.0, 120.0) is None, "a max_tokens=1 probe hangs"
    assert run.sim.engine_gauges()[0].waiting == 0
    assert run.sim.gpu_states(700.0)[0].utilization_ratio == 0.0, "a stopped engine runs no kernel"
    assert not run.sim.abort("probe", 700.0), "a stopped engine processes no abort"


def test_hang_idle_waits_for_an_idle_moment() -> None:
    # The same wedge time under a load with no lull: the engine is never idle, so it never stops.
    run = drive(scenario_config("hang-idle"), scenario_load("hang"), until_s=45.0)
    assert run.hung_s is None
    assert run.samples[-1].finished > run.samples[25].finished


def test_hang_idle_at_zero_is_wedged_from_the_start() -> None:
    recorder = ListRecorder()
    sim = Simulation(scenario_config("hang-idle", hang_idle_after_s=0.0), recorder)
    assert sim.step(0.0).hung, "the server steps once as it starts: idle, so stopped"
    assert _probe(sim, recorder, 0.0, 120.0) is None
    gauges = sim.engine_gauges()[0]
    assert (gauges.running, gauges.waiting) == (0, 0)
    assert recorder.steps == []


def test_a_configured_wedge_time_moves_the_wedge() -> None:
    run = _hang_idle(40.0, hang_idle_after_s=25.0)
    assert run.hung_s is not None
    assert 25.0 <= run.hung_s < 25.1, "idle since about 20 s (the lull), stopped once due"
    queued = drive(scenario_config("hang-queue", hang_queue_after_s=35.0), scenario_load("hang-queue"), until_s=45.0)
    assert next(s for s in queued.samples if s.t >= 30.0).running == 16
    assert queued.samples[-1].running == 0


# --- over HTTP: what a sidecar's probe meets ---------------------------------------------------------------


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    config: SimConfig = request.param
    server = SimServer(config, host="127.0.0.1", port=0, log=io.StringIO())
    task = asyncio.create_task(server.run())
    yield await _url(server)
    server.stop()
    await asyncio.wait_for(task, 10.0)


async def _url(server: SimServer) -> str:
    for _ in range(500):
        try:
            return f"http://127.0.0.1:{server.port}"
        except RuntimeError:
            await asyncio.sleep(0.01)
    raise AssertionError("the simulator did not listen")


def _metric(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert len(values) == 1, (name, values)
    return values[0]


PROBE = {"model": "sim-llama", "prompt": "are you there", "max_tokens": 1}


@pytest.mark.parametrize("served", [scenario_config("healthy")], indirect=True)
async def test_a_probe_over_http_completes_on_a_healthy_server(served: str) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=10.0) as client:
        response = await client.post("/v1/completions", json=PROBE)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize(
    ("served", "waiting"),
    [
        (scenario_config("hang-queue", hang_queue_after_s=0.0), 1.0),
        (scenario_config("hang-idle", hang_idle_after_s=0.0), 0.0),
    ],
    indirect=["served"],
)
async def test_a_probe_over_http_hangs_on_a_wedged_server_whose_health_says_200(served: str, waiting: float) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=10.0) as client:
        probe = asyncio.create_task(client.post("/v1/completions", json=PROBE))
        done, _ = await asyncio.wait({probe}, timeout=1.0)
        assert not done, "the probe was answered by a wedged engine"
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 200
        metrics = (await client.get("/metrics")).text
        probe.cancel()
    assert _metric(metrics, "vllm:num_requests_running") == 0.0
    assert _metric(metrics, "vllm:num_requests_waiting") == waiting
    assert _metric(metrics, "vllm:generation_tokens_total") == 0.0


async def test_a_request_a_wedged_server_holds_is_aborted_cleanly_when_it_stops() -> None:
    server = SimServer(scenario_config("hang-idle", hang_idle_after_s=0.0), host="127.0.0.1", port=0, log=io.StringIO())
    run = asyncio.create_task(server.run())
    async with httpx.AsyncClient(base_url=await _url(server), timeout=10.0) as client:
        probe = asyncio.create_task(client.post("/v1/completions", json=PROBE))
        done, _ = await asyncio.wait({probe}, timeout=0.5)
        assert not done
        server.stop()
        response = await probe
    assert response.status_code == 500
    assert response.json()["message"] == "The server is shutting down: request aborted."
    assert await asyncio.wait_for(run, 10.0) == 0
