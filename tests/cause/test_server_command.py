"""vLLM's flags from its server's command line, for a log tail that no longer states them (issue 25, item 6):
what /proc showed while vLLM served is kept (`ServerCommandMemory`), travels with each read of the log
(`LogWithCommand`), and the death's reading uses it where vLLM's own arguments line is not in the tail."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from sidecar.actuators.log_source import LogRead, LogRun, Wanted
from sidecar.model.server_command import ServerCommand
from sidecar.parse.vllm_process import ProcessEntry, VllmProcesses, vllm_processes
from sidecar.shell.cause_reading import explain
from sidecar.shell.log_with_command import LogWithCommand
from sidecar.sources.vllm_command import ServerCommandMemory
from tests.cause.logs import OOM_CAUSE, OOM_FLAGS, WALL_S, oom_death

# A serving OOM with the budget nowhere in the tail: the doctor alone gives a step "below what you set".
SERVING_OOM = (
    "Traceback (most recent call last):\n"
    '  File "x.py", line 1, in execute_model\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.55 GiB memory in use. "
    "Of the allocated memory 21.90 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but "
    "unallocated.\n"
)
PORT = 8000


def seen(command: str) -> ServerCommand:
    return ServerCommand(where="vLLM's server command line (pid 4242)", command=command, seen_wall_s=WALL_S - 3600)


def read_of(text: str, command: ServerCommand | None) -> LogRead:
    return LogRead(where="file /var/log/vllm.log", runs=(LogRun(text=text, label=""),), command=command)


def test_without_a_command_the_budget_is_a_step_below_what_was_set() -> None:
    cause = explain(read_of(SERVING_OOM, None), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, cause.recommendations) == ("configuration_overshoot", ())
    assert cause.steps[0].startswith("lower --gpu-memory-utilization by 0.050 below what you set")
    assert "command line" not in cause.source


@pytest.mark.parametrize(
    ("command", "value", "current"),
    [
        # The budget set on the command line: 0.95 - 0.050 = 0.90.
        ("/opt/venv/bin/python3 /opt/venv/bin/vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.95", 0.9, 0.95),
        # A real server's command line is all vLLM parsed: a flag left out is vLLM's default, 0.9 - 0.050.
        ("python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B --port 8000", 0.85, 0.9),
    ],
)
def test_the_servers_command_line_turns_the_step_into_a_value(command: str, value: float, current: float) -> None:
    cause = explain(read_of(SERVING_OOM, seen(command)), Wanted.DIED, wall_time_s=WALL_S)
    assert cause.cause == "configuration_overshoot"
    first = cause.recommendations[0]
    assert (first.flag, first.value, first.current) == ("--gpu-memory-utilization", value, current)
    assert cause.source.endswith("flags from vLLM's server command line (pid 4242)")


def test_a_config_file_on_the_command_line_leaves_the_budget_unknown() -> None:
    """What `--config` leaves out may be in the file: no default is assumed, the step stays a step."""
    command = seen("vllm serve Qwen/Qwen3-8B --config /etc/vllm/serve.yaml")
    cause = explain(read_of(SERVING_OOM, command), Wanted.DIED, wall_time_s=WALL_S)
    assert cause.recommendations == ()
    assert cause.steps[0].startswith("lower --gpu-memory-utilization by 0.050 below what you set")


def test_vllms_own_arguments_line_wins_over_the_command_line() -> None:
    """The start that died logged its arguments: the budget read from them (0.9), not a command line seen
    before a restart that may have changed it."""
    command = seen("vllm serve m --gpu-memory-utilization 0.5")
    cause = explain(read_of(oom_death(), command), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, tuple(change.pasted for change in cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)
    assert "command line" not in cause.source


def entry(pid: int, ppid: int, command: str, state: str = "S") -> ProcessEntry:
    return ProcessEntry(pid=pid, ppid=ppid, command=command, state=state)


class Table:
    """A process table as /proc would show it, changed by the test between reads; counts the reads."""

    def __init__(self, *entries: ProcessEntry) -> None:
        self.entries = list(entries)
        self.reads = 0
        self.fail = False

    def __call__(self, port: int) -> VllmProcesses:
        self.reads += 1
        if self.fail:
            raise PermissionError("/proc: permission denied")
        return vllm_processes(self.entries, port=port, own_pid=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PID_30 = "vLLM's server command line (pid 30)"
SERVER = "vllm serve m --port 8000 --gpu-memory-utilization 0.8 --api-key sk-secret"


def memory(table: Table, clock: Clock) -> ServerCommandMemory:
    return ServerCommandMemory(PORT, find=table, clock=clock, wall_clock=lambda: WALL_S, refresh_s=300.0)


def test_the_server_for_the_port_is_read_on_the_first_poll_that_reaches_vllm() -> None:
    table = Table(
        entry(10, 1, "vllm serve other --port 8001"),  # another server, another port
        entry(20, 1, SERVER),
        entry(21, 20, "VLLM::EngineCore"),
    )
    clock = Clock()
    kept = memory(table, clock)
    asyncio.run(kept.observe(reached=False, newly_reached=True))  # vLLM not reached: /proc is not read
    assert (table.reads, kept.seen) == (0, None)
    asyncio.run(kept.observe(reached=True, newly_reached=True))
    assert kept.seen == ServerCommand(
        where="vLLM's server command line (pid 20)",
        command="vllm serve m --port 8000 --gpu-memory-utilization 0.8 --api-key ***",
        seen_wall_s=WALL_S,
    )


def test_it_is_read_again_after_a_new_start_or_the_refresh_interval_and_kept_when_nothing_is_seen() -> None:
    table = Table(entry(20, 1, SERVER))
    clock = Clock()
    kept = memory(table, clock)
    asyncio.run(kept.observe(reached=True, newly_reached=True))
    clock.now += 299.0
    asyncio.run(kept.observe(reached=True, newly_reached=False))
    assert table.reads == 1  # within the interval, vLLM still answering: not read again
    table.entries = [entry(30, 1, "vllm serve m --port 8000 --max-num-seqs 64")]
    asyncio.run(kept.observe(reached=True, newly_reached=True))  # a new start: read at once
    assert (table.reads, kept.seen and kept.seen.where) == (2, PID_30)
    table.entries = [entry(31, 1, "VLLM::EngineCore")]  # the server's process not seen
    clock.now += 300.0
    asyncio.run(kept.observe(reached=True, newly_reached=False))
    assert (table.reads, kept.seen and kept.seen.where) == (3, PID_30)  # what was seen is kept
    table.fail = True
    clock.now += 300.0
    asyncio.run(kept.observe(reached=True, newly_reached=False))  # a failing read never raises
    assert (table.reads, kept.seen and kept.seen.where) == (4, PID_30)


class OneRead:
    where = "file /var/log/vllm.log"

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        del until_wall_s, wanted
        return read_of(SERVING_OOM, None)


def test_every_read_of_the_log_carries_what_was_seen_last() -> None:
    table = Table(entry(20, 1, SERVER))
    kept = memory(table, Clock())
    log = LogWithCommand(OneRead(), kept)
    assert log.where == "file /var/log/vllm.log"
    before = asyncio.run(log.read(until_wall_s=WALL_S, wanted=Wanted.DIED))
    assert before.command is None
    asyncio.run(kept.observe(reached=True, newly_reached=True))
    after = asyncio.run(log.read(until_wall_s=WALL_S, wanted=Wanted.DIED))
    assert after == dataclasses.replace(before, command=kept.seen)
