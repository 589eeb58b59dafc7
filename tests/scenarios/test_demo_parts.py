"""The demo's parts, without the whole demo: what it tells, its load, the stand-in for systemd that counts
crashes and the sidecar's restarts, and the restart command the sidecar's exec adapter runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from rich.console import Console

from sidecar.demo import story
from sidecar.demo.control import ControlServer, write_token
from sidecar.demo.load import LoadCounters, LoadShape, drive
from sidecar.demo.runner import Demo, DemoOptions
from sidecar.demo.sidecar_log import SidecarLog
from sidecar.demo.story import LINGER_S, TWIN_LINGER_S, TWIN_WAIT_S
from sidecar.demo.supervisor import SimSupervisor
from sidecar.demo.view import policy_panel
from sidecar.exporter.server import HttpServer, Request, Response
from sidecar.shell.settings import Settings
from sidecar.sim.config import SCENARIOS
from sidecar.sim.scenarios import LoadShape as Schedule


def test_every_scenario_has_its_story_in_the_help() -> None:
    assert set(story.STORIES) == set(SCENARIOS)
    epilog = story.help_epilog()
    for name in SCENARIOS:
        assert f"  {name} " in epilog
    assert max(len(line) for line in epilog.splitlines()) <= 100


def test_the_shortened_settings_quote_the_daemons_own_defaults() -> None:
    line = story.shortened_line()
    for item in story.SHORTENED:
        default = Settings.model_fields[item.setting].default
        assert float(item.value) < default, f"{item.flag} is shortened"
        assert f"{item.flag} {item.value} (default {default:g})" in line
    assert story.daemon_flags()[:2] == ["--forecast-min-uptime", "40"]


def _text(panel: object) -> str:
    console = Console(width=140, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the console
    console.print(panel)
    return console.export_text()


def test_the_policy_panel_always_has_state_reason_and_the_held_back_restart() -> None:
    blocked = "vLLM up only 33 s < 40 s before a forecast-driven restart"
    text = _text(
        policy_panel(
            {
                "state": "paused",
                "admission_paused": True,
                "readiness": "paused: GPU free memory 4.9 % < 5.0 % of total on GPU 0",
                "reason": f"would restart (oom_forecast): forecast time to OOM 28 s < 900 s; but {blocked}",
                "would_restart_but": blocked,
            }
        )
    )
    assert "state: PAUSED" in text
    assert "admission: PAUSED" in text
    assert "why: would restart (oom_forecast)" in text
    assert f"would restart, but: {blocked}" in text
    quiet = _text(policy_panel({"state": "normal", "reason": "normal: no condition met", "would_restart_but": None}))
    assert "would restart, but: - (no restart held back)" in quiet
    assert "state: -" in _text(policy_panel(None))


def test_the_demo_load_is_each_scenarios_calibrated_load() -> None:
    burst = LoadShape.for_scenario("burst")
    assert [burst.schedule.concurrency_at(t) for t in (0.0, 20.0)] == [16, 64]
    assert burst.prompt_tokens == (2000, 2000)
    smaller = LoadShape.for_scenario("burst", concurrency=8)
    assert [smaller.schedule.concurrency_at(t) for t in (0.0, 20.0)] == [8, 8]
    thrash = LoadShape.for_scenario("prefix-thrash")
    assert (thrash.shared_prefixes, thrash.shared_prefix_tokens, thrash.shared_share) == (128, 1536, 1.0)
    leak = LoadShape.for_scenario("leak")
    assert (leak.concurrency, leak.prompt_tokens, leak.output_tokens) == (32, (800, 1200), (128, 128))
    assert leak.shared_share == 0.5, "half the prompts share a prefix, so the prefix cache has something to hit"
    idle = LoadShape.for_scenario("hang-idle")
    assert idle.schedule.concurrency_at(25.0) == 0, "the lull in which the engine stops while idle"


def test_the_exit_line_has_the_contracts_words() -> None:
    with _demo(DemoOptions()) as demo:
        demo.counters.sent, demo.counters.succeeded, demo.counters.failed = 12, 9, 2
        demo.sim.crashes, demo.sim.restarts_by_sidecar = 1, 2
        assert demo.exit_line() == (
            "demo stopped: 12 requests sent, 9 ok, 2 failed; vLLM crashed 1 time, restarted by the sidecar 2 times; "
            f"logs in {demo.workdir}"
        )
        demo.counters.interrupted = 1
        assert "12 requests sent, 9 ok, 2 failed, 1 interrupted by the stop; vLLM crashed" in demo.exit_line()


def _status(state: str, reason: str, blocked: str | None = None) -> dict[str, object]:
    return {"policy": {"state": state, "reason": reason, "would_restart_but": blocked}}


def test_the_demo_stops_itself_once_vllm_is_back_from_the_sidecars_restart() -> None:
    with _demo(DemoOptions(scenario="healthy")) as demo:  # a scenario without the vLLM without a sidecar
        assert demo.twin is None
        demo._follow_policy(_status("draining", "restart (oom_forecast) begins"), 100.0, 0)
        assert not demo._should_stop(200.0), "no restart by the sidecar yet"
        demo._follow_policy(_status("paused", "an answer from before the restart"), 101.0, 0)
        assert not demo._should_stop(200.0), "a /status asked for before the demo restarted the simulator"
        demo._follow_policy(_status("restarting", "waiting for vLLM"), 101.0, 1)
        assert not demo._should_stop(200.0), "still restarting"
        demo._follow_policy(_status("cooldown", "cooldown: restarts allowed again in 59 s"), 104.0, 1)
        assert not demo._should_stop(104.0 + LINGER_S - 0.5)
        assert demo._should_stop(104.0 + LINGER_S)
        assert demo.events[-1].endswith("the sidecar's restart is over (policy cooldown): vLLM serves again")
    with _demo(DemoOptions(keep_running=True)) as demo:
        demo._follow_policy(_status("cooldown", "cooldown"), 104.0, 1)
        assert not demo._should_stop(1000.0), "--keep-running"


def test_the_leak_demo_waits_for_the_crash_of_the_vllm_without_the_sidecar() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory."
    with _demo(DemoOptions(scenario="leak")) as demo:
        assert demo.twin is not None
        demo._follow_policy(_status("cooldown", "cooldown"), 104.0, 1)
        assert not demo._should_stop(104.0 + LINGER_S), "the vLLM without the sidecar has not crashed yet"
        assert "stops in" not in demo._ending(104.0 + LINGER_S)
        demo.twin.sim.first_crash = (120.0, oom)
        assert not demo._should_stop(120.0 + TWIN_LINGER_S - 0.5)
        assert demo._should_stop(120.0 + TWIN_LINGER_S)
        assert demo._ending(121.0) == "the story is over: the demo stops in 4 s (--keep-running: stay)"
    with _demo(DemoOptions(scenario="leak")) as demo:
        demo._follow_policy(_status("cooldown", "cooldown"), 104.0, 1)
        assert demo._should_stop(104.0 + TWIN_WAIT_S), "it waits for that crash a minute at most"
    with _demo(DemoOptions(scenario="burst")) as demo:  # the sidecar pauses; nothing to restart
        assert demo.twin is not None
        demo.twin.sim.first_crash = (30.0, oom)
        assert demo._should_stop(30.0 + TWIN_LINGER_S)
    with _demo(DemoOptions(scenario="hang")) as demo:  # the one without the sidecar only hangs
        demo._follow_policy(_status("cooldown", "cooldown"), 50.0, 1)
        assert demo._should_stop(50.0 + LINGER_S)


def test_the_sidecars_lines_come_before_the_restart_they_asked_for(tmp_path: Path) -> None:
    records: list[dict[str, object]] = [
        {"event": "policy_state", "previous": "paused", "state": "restarting", "reason": "engine hung: no drain"},
        {
            "event": "action",
            "action": "drain",
            "reason": "restart (engine_hung) begins: ...; admission paused, no drain",
        },
        {"event": "action", "action": "restart", "reason": "engine hung: no drain"},
        {"event": "probe_sent", "kind": "probe", "reason": "not told: a line still being written"},
    ]
    log = tmp_path / "sidecar.log"
    whole = "".join(json.dumps({**record, "timestamp": "2030-01-01T00:00:00Z"}) + "\n" for record in records[:3])
    log.write_text(whole + json.dumps(records[3])[:20])
    with _demo(DemoOptions(scenario="hang")) as demo:
        demo._sidecar_log = SidecarLog(log, demo._started_wall)
        demo._event("the sidecar's restart adapter asks the demo to restart vLLM (engine_hung)")
        texts = [line.split(" s  ", 1)[1] for line in demo.events]
    assert texts == [
        "sidecar policy: paused -> restarting: engine hung: no drain",
        "sidecar decides: restart at once, no drain (the engine's requests cannot finish)",
        "sidecar decides: restart",
        "the sidecar's restart adapter asks the demo to restart vLLM (engine_hung)",
    ]


@contextlib.contextmanager
def _demo(options: DemoOptions) -> Iterator[Demo]:
    demo = Demo(options, Console(file=open(os.devnull, "w")))  # noqa: SIM115 - the demo's console, never drawn
    try:
        yield demo
    finally:
        shutil.rmtree(demo.workdir)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_a_stop_counts_the_requests_in_flight_as_interrupted() -> None:
    async def never(request: Request) -> Response:
        await asyncio.sleep(3600)
        return Response.text(HTTPStatus.OK, "never")

    server = HttpServer(host="127.0.0.1", port=0, handler=never)
    await server.start()
    counters, stop = LoadCounters(), asyncio.Event()
    shape = LoadShape(schedule=Schedule(concurrency=3), prompt_tokens=(10, 20), output_tokens=(4, 4))
    url = f"http://127.0.0.1:{server.port}"
    load = asyncio.create_task(
        drive(vllm_url=url, readiness_url=None, model="m", shape=shape, counters=counters, stop=stop)
    )
    try:
        for _ in range(100):
            if counters.sent == 3:
                break
            await asyncio.sleep(0.05)
        assert counters.oldest_in_flight_s(time.monotonic()) is not None
        stop.set()
        await asyncio.wait_for(load, 10)
    finally:
        await server.stop()
    assert (counters.sent, counters.failed, counters.interrupted, counters.in_flight) == (3, 0, 3, 0)


async def test_the_supervisor_counts_crashes_apart_from_the_sidecars_restarts(tmp_path: Path) -> None:
    events: list[str] = []
    crashing = SimSupervisor(
        _python("import sys; print('ValueError: no room'); sys.exit(3)"),
        tmp_path,
        restart_delay_s=5.0,
        event=events.append,
    )
    process = crashing.start()
    await asyncio.to_thread(process.process.wait, 30)
    now = time.monotonic()
    crashing.supervise(now)
    assert crashing.crashes == 1
    assert events[-1] == "vLLM CRASHED: exited with code 3: ValueError: no room"
    assert crashing.first_crash == (now, "ValueError: no room")
    assert "started again in 5 s" in crashing.state(now)
    crashing.supervise(now + 5.0)
    assert crashing.process is not process, "started again after the delay, as Restart=on-failure"
    crashing.stop()
    assert crashing.restarts_by_sidecar == 0

    events.clear()
    serving = SimSupervisor(_python("import time; time.sleep(60)"), tmp_path, restart_delay_s=5.0, event=events.append)
    first = serving.start()
    line = await serving.restart("oom_forecast: forecast time to OOM 27 s")
    assert first.exit_code() is not None
    assert line.startswith(f"stopped pid {first.pid} (exit ")
    assert (serving.crashes, serving.restarts_by_sidecar) == (0, 1)
    assert serving.first_restart_s is not None
    assert serving.process is not None
    assert serving.process.exit_code() is None
    serving.supervise(time.monotonic())
    assert serving.crashes == 0, "a stop the sidecar asked for is no crash"
    serving.stop()
    with pytest.raises(RuntimeError, match="stopping"):
        await serving.restart("late")


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[tuple[ControlServer, Path, list[str]]]:
    asked: list[str] = []

    async def restart(reason: str) -> str:
        asked.append(reason)
        return "stopped pid 1 (exit 0); started the simulated vLLM again as pid 2"

    token_file = tmp_path / "token"
    server = ControlServer(write_token(token_file), restart)
    await server.start()
    yield server, token_file, asked
    await server.stop()


async def _restart_command(url: str, token_file: Path, reason: str = "") -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.demo.restart",
        "--url",
        url,
        "--token-file",
        str(token_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "VLLM_SIDECAR_RESTART_REASON": reason},
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    return int(process.returncode or 0), stdout.decode(), stderr.decode()


async def test_the_restart_command_asks_the_demo_and_reports_its_line(
    control: tuple[ControlServer, Path, list[str]], tmp_path: Path
) -> None:
    server, token_file, asked = control
    assert token_file.stat().st_mode & 0o777 == 0o600
    code, stdout, _ = await _restart_command(server.url, token_file, "oom_forecast: drained")
    assert (code, stdout.strip()) == (0, "stopped pid 1 (exit 0); started the simulated vLLM again as pid 2")
    assert asked == ["oom_forecast: drained"]

    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token\n")
    code, stdout, stderr = await _restart_command(server.url, wrong)
    assert (code, stdout) == (1, "")
    assert stderr.strip() == "the demo refused the restart (HTTP 403): wrong or missing token"
    code, _, stderr = await _restart_command(server.url, tmp_path / "missing")
    assert code == 1
    assert stderr.startswith("cannot read the demo's token file")
    assert len(asked) == 1


async def test_the_restart_command_fails_in_one_line_when_the_demo_is_gone(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    write_token(token_file)
    server = ControlServer("x", lambda _: asyncio.sleep(0, "never"))
    await server.start()
    url = server.url
    await server.stop()
    code, _, stderr = await _restart_command(url, token_file)
    assert code == 1
    assert stderr.startswith(f"the demo did not answer at {url}: ConnectError")
    assert len(stderr.strip().splitlines()) == 1
