"""Why vLLM died, from what a log reader returned: which start of vLLM is read, and what the doctor says of it."""

from __future__ import annotations

import pytest

from sidecar.actuators.log_source import LogRead, LogRun, Wanted
from sidecar.shell.cause_reading import MAX_EVIDENCE_CHARS, explain
from sidecar.sim.config import GIB, MIB, SimConfig, VllmVersion
from sidecar.sim.logs import death_lines, preamble_lines
from sidecar.sim.memory import OutOfMemory
from tests.cause.logs import (
    OOM_CAUSE,
    OOM_FLAGS,
    REFUSED,
    REFUSED_CAUSE,
    REFUSED_FLAGS,
    STARTED,
    WALL_S,
    oom_death,
)

EXIT_1 = "vllm.service: Main process exited, code=exited, status=1/FAILURE"
KILLED = "vllm.service: Main process exited, code=killed, status=9/KILL"
STOPPED = "Stopped vllm.service - vLLM OpenAI-compatible server."


def file(text: str) -> LogRead:
    return LogRead(where="file /var/log/vllm.log", runs=(LogRun(text=text, label=""),))


def journal(*runs: LogRun) -> LogRead:
    return LogRead(where="journal of vllm.service (system manager)", runs=runs)


def flags(read: LogRead, wanted: Wanted = Wanted.DIED) -> tuple[str | None, tuple[str, ...]]:
    cause = explain(read, wanted, wall_time_s=WALL_S)
    return cause.cause, tuple(change.pasted for change in cause.recommendations)


@pytest.mark.parametrize("version", list(VllmVersion))
def test_a_cuda_oom_death_names_its_cause_and_the_flags_for_every_vllm_line(version: VllmVersion) -> None:
    cause = explain(file(oom_death(version)), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, cause.severity) == (OOM_CAUSE, "critical")
    assert tuple(change.pasted for change in cause.recommendations) == OOM_FLAGS
    assert cause.summary == "vLLM died of an out-of-memory error while serving: another process holds part of the card"
    assert cause.evidence[0].startswith("CUDA out of memory while serving: tried to allocate 2.00 GiB")
    assert cause.source.startswith("file /var/log/vllm.log, ")
    assert cause.source.endswith(" lines")
    assert cause.read_wall_time_s == WALL_S
    assert cause.recommendations[0].why.startswith("(80.00 GiB - 6.00 GiB other processes")


def test_a_refused_start_of_a_real_vllm_says_which_max_model_len_fits() -> None:
    cause = explain(file(REFUSED), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, tuple(change.pasted for change in cause.recommendations)) == (REFUSED_CAUSE, REFUSED_FLAGS)
    assert cause.summary == "vLLM could not start: max_model_len 2,048 is more than its KV cache holds (992 tokens)"
    assert all(len(line) <= MAX_EVIDENCE_CHARS for line in cause.evidence)
    assert cause.source == "file /var/log/vllm.log, 150 lines"


def test_a_good_start_has_no_cause_and_the_doctors_advice_is_not_one() -> None:
    """The doctor advises --shutdown-timeout on this log (info): good to know, not why vLLM died."""
    cause = explain(file(STARTED), Wanted.DIED, wall_time_s=WALL_S)
    assert cause.cause is None
    assert cause.severity is None
    assert cause.recommendations == ()
    assert cause.summary == "vLLM's log shows no crash (no CUDA out-of-memory error, refused start or dead engine)"
    assert cause.line() == f"cause unknown: {cause.summary}"


def test_a_file_with_the_crash_and_a_new_start_after_it() -> None:
    """vLLM died and was started again (by docker, a script): the death is the one before the last start."""
    read = file(oom_death() + STARTED)
    assert flags(read, Wanted.DIED) == (OOM_CAUSE, OOM_FLAGS)
    assert flags(read, Wanted.LAST) == (None, ())
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert "an earlier start" in cause.source


def test_a_tail_that_begins_inside_the_run_that_died() -> None:
    """The 256 KiB tail cut off the dying run's start: its traceback alone still names the cause, and the budget
    that fits beside the other process is an upper bound whatever the arguments said."""
    crash = oom_death().splitlines()
    tail = [line for line in crash if "non-default args" not in line]
    assert flags(file("\n".join(tail) + "\n" + STARTED)) == (OOM_CAUSE, OOM_FLAGS)


def test_the_banner_before_the_arguments_is_not_a_start_of_its_own() -> None:
    """vLLM prints its banner and warnings before its arguments: one start, not two."""
    cause = explain(file(STARTED), Wanted.DIED, wall_time_s=WALL_S)
    assert "earlier start" not in cause.source


def test_journal_the_invocation_that_died_when_systemd_already_started_the_next() -> None:
    read = journal(
        LogRun(text=oom_death(), label="invocation 1", ended=EXIT_1, failed=True),
        LogRun(text=STARTED, label="invocation 2"),  # Restart=on-failure: loading again
    )
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, tuple(c.pasted for c in cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)
    assert cause.source.startswith("journal of vllm.service (system manager), invocation 1, ")
    assert cause.evidence[-1] == f"how it ended: {EXIT_1}"
    assert "invocation 2" in explain(read, Wanted.LAST, wall_time_s=WALL_S).source


def test_journal_a_crash_loop_read_while_the_next_invocation_is_still_starting() -> None:
    """Restart=always: vLLM refused to start and systemd started it again, and the log is read while the new
    invocation loads (no failure, no sign of serving yet). That start has nothing to say yet; the one before it
    is what it will most likely do again, and is read, as `parse_log` reads a file that ends so. (Found by the
    remediation test on a real vLLM under systemd, replayed as the journal splits it: from the file the refusal
    was seen until the next start served; from the journal only in the seconds between a refusal and the next
    invocation's first line, which reads every 30 s mostly missed.)"""
    loading = "\n".join(REFUSED.splitlines()[:30])  # banner, arguments, the engine's config: still starting
    read = journal(
        LogRun(text=REFUSED, label="invocation 1", ended=EXIT_1, failed=True),
        LogRun(text=loading, label="invocation 2"),
    )
    for wanted in (Wanted.LAST, Wanted.DIED):
        cause = explain(read, wanted, wall_time_s=WALL_S)
        assert (cause.cause, tuple(c.pasted for c in cause.recommendations)) == (REFUSED_CAUSE, REFUSED_FLAGS)
        assert cause.crashed
        assert cause.source.startswith("journal of vllm.service (system manager), invocation 1, ")
        assert cause.recommendations[0].current == 2048
    assert flags(file(REFUSED + loading), Wanted.LAST) == flags(read, Wanted.LAST)  # a file reads the same
    # A new invocation that serves, or that systemd says ended, is read for itself.
    served = journal(read.runs[0], LogRun(text=STARTED, label="invocation 2"))
    assert "invocation 2" in explain(served, Wanted.LAST, wall_time_s=WALL_S).source
    ended = journal(read.runs[0], LogRun(text=loading, label="invocation 2", ended=KILLED, failed=True))
    assert "invocation 2" in explain(ended, Wanted.LAST, wall_time_s=WALL_S).source


STARTING = "Starting vllm.service - vLLM OpenAI-compatible server..."
ARGS = "(APIServer pid=2) INFO 11-22 06:30:00 [api_utils.py:286] non-default args: {'model': 'tiny'}"
STARTED_LINE = "Started vllm.service - vLLM OpenAI-compatible server."


@pytest.mark.parametrize(
    "order",
    [
        (STARTING, ARGS, STARTED_LINE, "second start"),
        # CI run 1 of 2026-11-30: systemd's "Started" after vLLM's lines; the arguments line, starting with "(",
        # was read as the rest of "Starting ...", so the new invocation had no start of its own.
        (STARTING, ARGS, "second start", STARTED_LINE),
    ],
)
def test_journal_a_wrapped_line_in_the_next_invocation_does_not_hide_the_one_that_died(order: tuple[str, ...]) -> None:
    """journald orders systemd's own lines and vLLM's output as they arrive: here vLLM's arguments line came
    before systemd's "Started", and a line starting lower-case followed, which the parser joins to the one before
    (a wrapped message). The new invocation is one start, so the invocation that died is still among those read.
    (Found by the journal test under load: the split counted raw lines where the parser counted joined ones, made
    two starts of the new invocation and never looked at the one that died.)"""
    read = journal(
        LogRun(text=oom_death(), label="invocation 1", ended=EXIT_1, failed=True),
        LogRun(text="\n".join(order), label="invocation 2"),
    )
    assert flags(read) == (OOM_CAUSE, OOM_FLAGS)
    assert "earlier start" not in explain(read, Wanted.LAST, wall_time_s=WALL_S).source


def test_journal_a_kill_with_nothing_in_the_log_says_how_it_ended() -> None:
    """The kernel's OOM killer leaves no line in vLLM's log; systemd's line is all there is."""
    read = journal(
        LogRun(text=STARTED, label="invocation 1", ended=KILLED, failed=True),
        LogRun(text=STARTED, label="invocation 2"),
    )
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert cause.cause is None
    assert "invocation 1" in cause.source
    assert cause.summary.endswith(f"({KILLED})")


def test_journal_an_engine_dead_in_a_live_process_after_a_clean_restart() -> None:
    """The invocation before was stopped by a restart (cleanly): the dead one is the current invocation."""
    dead = STARTED + "(APIServer pid=7) ERROR 11-22 06:30:00 [core.py:1] EngineCore encountered a fatal error.\n"
    read = journal(
        LogRun(text=STARTED, label="invocation 1", ended=STOPPED, failed=False),
        LogRun(text=dead, label="invocation 2"),
    )
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert "invocation 2" in cause.source
    assert cause.summary == "vLLM's engine died (EngineDeadError) and its log does not say why"
    quiet = journal(read.runs[0], LogRun(text=STARTED, label="invocation 2"))
    assert "invocation 2" in explain(quiet, Wanted.DIED, wall_time_s=WALL_S).source


def test_journal_the_last_invocation_stopped_with_no_crash_in_its_log() -> None:
    read = journal(LogRun(text=STARTED, label="invocation 1", ended=STOPPED, failed=False))
    cause = explain(read, Wanted.DIED, wall_time_s=WALL_S)
    assert (
        cause.summary
        == f"vLLM's log shows no crash (no CUDA out-of-memory error, refused start or dead engine) ({STOPPED})"
    )


def test_an_oom_inside_the_budget_lowers_the_budget_by_what_the_allocation_lacked() -> None:
    """No other tenant (vLLM's process and what is free make up the card), no stranded memory: the transient was
    not budgeted for (issue 14)."""
    config = SimConfig(vllm_version=VllmVersion.V0_32)
    oom = OutOfMemory(
        gpu=0,
        tried_bytes=2 * GIB,
        total_bytes=80 * GIB,
        free_bytes=512 * MIB,
        process_bytes=80 * GIB - 512 * MIB,
        allocated_bytes=70 * GIB,
        reserved_unallocated_bytes=64 * MIB,
        other_processes=(),
    )
    text = "\n".join([*preamble_lines(config, WALL_S), *death_lines(config, 0, oom, WALL_S)])
    cause = explain(file(text), Wanted.DIED, wall_time_s=WALL_S)
    assert cause.cause == "configuration_overshoot"
    # 0.9 (vLLM's default) - 1.50 GiB lacked / 80 GiB - 0.01 = 0.87125 -> 0.87
    assert cause.recommendations[0].pasted == "--gpu-memory-utilization 0.87"


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        ("", "vLLM's log is empty"),
        ("\x00\x01\ufffd\ufffd garbage\n" * 40, "no line of vLLM recognised in the last 40 lines of its log"),
    ],
)
def test_an_empty_or_binary_log_says_so(text: str, summary: str) -> None:
    cause = explain(file(text), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, cause.summary) == (None, summary)


def test_a_cause_without_a_flag_value_carries_the_doctors_step() -> None:
    """The budget is not in the log: the doctor gives its lowering as a step, and the notification says it, no
    more sure of it than the doctor is."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.65 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.55 GiB memory in use. "
        "Of the allocated memory 21.90 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but "
        "unallocated."
    )
    text = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1, in execute_model', oom]) + "\n"
    cause = explain(file(text), Wanted.DIED, wall_time_s=WALL_S)
    assert (cause.cause, cause.recommendations) == ("configuration_overshoot", ())
    assert cause.steps[0].startswith("lower --gpu-memory-utilization by 0.050 below what you set")
    assert "; next: lower --gpu-memory-utilization by 0.050" in cause.line()
