"""Who restarts a vLLM that is gone (issue 28), in the shell: the adapter's word, and the one sign that overrules
"nobody else will": a vLLM server for the same port started since vLLM went (an operator restarting it by
hand). Real processes read from the real /proc; a real closed port for "nothing listens"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.derive.settings import DeriveSettings
from sidecar.model.supervision import Restarter, Supervision
from sidecar.shell.poller import Poller
from sidecar.sources.fetch import HttpxFetcher
from sidecar.sources.vllm_command import ServerCommandMemory
from sidecar.sources.vllm_http import VllmHttpSource
from sidecar.sources.vllm_start import StartedServer, VllmStartWatch, boot_clock_s, serves_port
from tests.loopback import closed_port

SLEEPER = "import time; time.sleep(60)"
EXEC_SAYS = "the sidecar starts it (--actuator exec: restart.sh)"
SEEN_WITHIN_S = 30.0


@pytest.mark.parametrize(
    ("command", "port", "serves"),
    [
        ("vllm serve meta-llama/Llama-3.1-8B --port 8001", 8001, True),
        ("/opt/venv/bin/vllm serve /models/x", 8000, True),  # vLLM's default port
        ("/opt/venv/bin/vllm serve /models/x", 8001, False),
        ("python -m vllm.entrypoints.openai.api_server --model m --port=9000", 9000, True),
        ("python -m vllm.entrypoints.openai.api_server --model m --port 9000", 9001, False),
        ("python -m sidecar run --vllm-url http://127.0.0.1:8000", 8000, False),  # the sidecar is no server
        ("vllm-sidecar run --vllm-url http://127.0.0.1:8000", 8000, False),
        ("VLLM::EngineCore", 8000, False),  # an engine core left over: not someone starting a server
        ("vllm bench serve --port 8000", 8000, False),
    ],
)
def test_what_counts_as_a_vllm_server_for_the_port(command: str, port: int, *, serves: bool) -> None:
    assert serves_port(command, port) is serves


def _start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SLEEPER, *args])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _serve_http(port: int) -> subprocess.Popen[bytes]:
    """An HTTP server process on `port`, once it accepts connections (its start-up can take seconds on a busy
    box)."""
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    _listening(port)
    return server


def _listening(port: int) -> None:
    deadline = time.monotonic() + SEEN_WITHIN_S
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {SEEN_WITHIN_S} s")


def _seen(watch: VllmStartWatch, since: float, count: int) -> list[StartedServer]:
    """What the watch sees once `count` servers show (a process's command line shows just after its exec; on a
    box busy with other test lanes, Python's start-up can take seconds)."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    while len(found := watch.started_since(since)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) >= count, f"{len(found)} of {count} servers seen in {SEEN_WITHIN_S} s: {found}"
    return found


def test_a_server_for_the_port_started_since_is_seen_and_nothing_else_is(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    port = closed_port()
    processes.append(_start("vllm", "serve", "--port", str(port)))  # before vLLM went
    time.sleep(0.2)  # /proc counts start times in whole clock ticks (10 ms): well apart from `since`
    since = boot_clock_s()
    time.sleep(0.05)
    watch = VllmStartWatch(port)
    processes.append(_start("vllm", "serve", "--port", str(port + 1)))  # another port
    processes.append(_start("python", "-m", "sidecar", "run", "--vllm-url", f"http://127.0.0.1:{port}"))
    assert len(_seen(VllmStartWatch(port + 1), since, 1)) == 1  # the others have their command lines by now
    assert watch.started_since(since) == []
    after = _start("vllm", "serve", "--port", str(port))
    processes.append(after)
    (found,) = _seen(watch, since, 1)
    assert found.pid == after.pid
    assert found.command.endswith(f"vllm serve --port {port}")
    assert VllmStartWatch(port, own_pid=after.pid).started_since(since) == []  # never the sidecar itself


def test_a_start_in_the_clock_tick_the_bound_falls_in_counts(tmp_path: Path) -> None:
    """/proc counts a start in clock ticks, rounded down: a server that forked 4 ms after the poll that reached
    vLLM began can read as 6 ms before it. The tick the bound falls in counts; the tick before it does not."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    since = 1000.0 + 0.4 * tick  # a poll began 40 % into a tick

    def server(pid: int, start_ticks: int) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"python\0-m\0vllm\0serve\0--port\08000\0")
        fields = ["S", *["0"] * 18, str(start_ticks), "0", "0"]
        (entry / "stat").write_text(f"{pid} (python) {' '.join(fields)}\n")

    in_the_tick, tick_before = round(1000.0 / tick), round(1000.0 / tick) - 1
    server(11, in_the_tick)
    server(12, tick_before)
    found = VllmStartWatch(8000, proc=tmp_path, own_pid=1).started_since(since)
    assert [server.pid for server in found] == [11]


class Says:
    def __init__(self, restarter: Restarter) -> None:
        self.restarter = restarter

    async def __call__(self) -> Supervision:
        return Supervision(restarter=self.restarter, detail=EXEC_SAYS)


def _poller(client: httpx.AsyncClient, port: int, said: Restarter, watch: VllmStartWatch | None) -> Poller:
    return Poller(
        vllm=VllmHttpSource(
            fetcher=HttpxFetcher(client), base_url=f"http://127.0.0.1:{port}", timeout_s=1.0, max_body_bytes=2**20
        ),
        gpu=None,
        derive=DeriveSettings(),
        supervision=Says(said),
        start_watch=watch,
    )


async def test_the_adapter_is_asked_while_nothing_listens_and_a_hand_start_overrules_nobody_else(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    port = closed_port()
    async with httpx.AsyncClient() as client:
        poller = _poller(client, port, Restarter.SIDECAR, VllmStartWatch(port))
        first = await poller.tick()  # vLLM gone: nobody else will start it, says the adapter
        assert first.snapshot.vllm_supervision == Supervision(restarter=Restarter.SIDECAR, detail=EXEC_SAYS)
        hand = _start("vllm", "serve", "--port", str(port))  # an operator starts it by hand
        processes.append(hand)
        _seen(VllmStartWatch(port), 0.0, 1)
        later = (await poller.tick()).snapshot.vllm_supervision
        assert later is not None
        assert later.restarter is Restarter.SUPERVISOR
        assert later.detail.startswith("a vLLM server for its port started ")
        assert f"not by the sidecar (pid {hand.pid}: " in later.detail
        # Another adapter's word is never changed; without a watch the adapter's word stands.
        unknown = await _poller(client, port, Restarter.UNKNOWN, VllmStartWatch(port)).tick()
        assert unknown.snapshot.vllm_supervision == Supervision(restarter=Restarter.UNKNOWN, detail=EXEC_SAYS)
        alone = await _poller(client, port, Restarter.SIDECAR, None).tick()
        assert alone.snapshot.vllm_supervision == Supervision(restarter=Restarter.SIDECAR, detail=EXEC_SAYS)


async def test_a_hand_restart_between_two_polls_is_seen_though_it_began_before_the_first_empty_poll(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """A poll reached vLLM; the operator's script then stopped it and started a new one; the next poll, an interval
    later (longer on a busy box), finds nothing listening. The new server started before that poll but after the
    one that reached vLLM, which is the bound: the first empty poll less a slack missed it (CI run 7 of
    2026-11-30), and the sidecar restarted a vLLM that was loading. The boot clock is moved 10 s on between the
    polls, as a slow interval would."""
    port = closed_port()
    # A real server process (it answers 404: reached, though no vLLM), so that killing it closes the port.
    server = _serve_http(port)
    processes.append(server)
    skew = [0.0]
    async with httpx.AsyncClient() as client:
        source = VllmHttpSource(
            fetcher=HttpxFetcher(client), base_url=f"http://127.0.0.1:{port}", timeout_s=1.0, max_body_bytes=2**20
        )
        poller = Poller(
            vllm=source,
            gpu=None,
            derive=DeriveSettings(),
            supervision=Says(Restarter.SIDECAR),
            start_watch=VllmStartWatch(port),
            boot_clock=lambda: boot_clock_s() + skew[0],
        )
        reached = await poller.tick()
        assert reached.snapshot.vllm_supervision is None, "asked only while nothing listens"
        server.kill()
        server.wait()
        hand = _start("vllm", "serve", "--port", str(port))
        processes.append(hand)
        _seen(VllmStartWatch(port), 0.0, 1)
        skew[0] = 10.0
        later = (await poller.tick()).snapshot.vllm_supervision
    assert later is not None
    assert later.restarter is Restarter.SUPERVISOR, later
    assert f"not by the sidecar (pid {hand.pid}: " in later.detail


def server_of(process: subprocess.Popen[bytes]) -> str:
    return f"vLLM's server command line (pid {process.pid})"


async def test_the_servers_command_line_is_kept_from_the_poll_that_reaches_a_new_start(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """What a death's reading uses where the log tail no longer states vLLM's flags: the command line of the
    server for the port, read from the real /proc when a poll reaches vLLM after one that did not."""
    port = closed_port()
    first = _start("vllm", "serve", "m", "--port", str(port), "--gpu-memory-utilization", "0.8")
    processes.append(first)
    _seen(VllmStartWatch(port), 0.0, 1)
    memory = ServerCommandMemory(port)
    async with httpx.AsyncClient() as client:
        source = VllmHttpSource(
            fetcher=HttpxFetcher(client), base_url=f"http://127.0.0.1:{port}", timeout_s=1.0, max_body_bytes=2**20
        )
        poller = Poller(vllm=source, gpu=None, derive=DeriveSettings(), command_memory=memory)
        await poller.tick()  # nothing listens yet: vLLM is loading, /proc is not read
        assert memory.seen is None
        server = _serve_http(port)  # it answers (404: reached, though no vLLM)
        processes.append(server)
        await poller.tick()
        assert memory.seen is not None
        assert (memory.seen.where, memory.seen.command.split()[-2:]) == (
            server_of(first),
            ["--gpu-memory-utilization", "0.8"],
        )
        server.kill()
        server.wait()
        first.kill()
        first.wait()
        await poller.tick()  # gone: what was seen is kept for the death's reading
        assert memory.seen.where == server_of(first)
        second = _start("vllm", "serve", "m", "--port", str(port), "--max-num-seqs", "64")
        processes.append(second)
        _seen(VllmStartWatch(port), 0.0, 1)
        processes.append(_serve_http(port))
        await poller.tick()
        assert (memory.seen.where, memory.seen.command.split()[-2:]) == (server_of(second), ["--max-num-seqs", "64"])
