"""The journal reader on a real systemd and journald, and journalctl's failures.

A real journal: the test root file system (VLLM_SIDECAR_ROOTFS) booted in systemd-nspawn with
`--volatile=overlay` (the shared tree is never written), PID 1 systemd 252 and its journald. A unit standing
for vLLM prints a CUDA OOM death (the simulator's rendering of vLLM 0.32's) and exits 1; `Restart=on-failure`
starts it again, and the second invocation prints a start and stays up. journalctl runs inside the container
(nsenter), as the sidecar's would on that machine, as root or as a user outside group systemd-journal.

The user manager the other systemd tests use runs no journald: its units' output reaches no journal
(checked here too, as what the sidecar then says). Without root, nspawn or the root file system the container
tests skip, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.actuators.journal_log import GROUP_HINT, JournalLog
from sidecar.actuators.log_source import LogUnreadableError, Wanted
from sidecar.shell.cause_reading import explain
from tests.actuators.user_systemd import UserSystemd
from tests.cause.logs import OOM_CAUSE, OOM_FLAGS, oom_death
from tests.conftest import required_in_ci
from tests.ship.nspawn import Container, boot, missing_requirements

ROOTFS_ENV = "VLLM_SIDECAR_ROOTFS"
UNIT = "crashy.service"
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
CRASH_SCRIPT = """#!/bin/sh
# vLLM's stand-in: the first invocation dies of a CUDA OOM, the next one starts and stays up.
if [ -e /run/crashy-crashed ]; then
  echo "(APIServer pid=2) INFO 11-22 06:30:00 [api_utils.py:286] non-default args: {'model': 'tiny'}"
  echo "second start"
  exec sleep infinity
fi
touch /run/crashy-crashed
printf '\\377\\376 not text\\n'
cat /test/crash.log
exit 1
"""
CRASH_UNIT = """[Unit]
Description=stands for vLLM: dies of a CUDA OOM once
[Service]
Type=exec
ExecStart=/bin/sh /test/crash.sh
Restart=on-failure
RestartSec=200ms
"""


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    rootfs = os.environ.get(ROOTFS_ENV)
    missing = missing_requirements() or (None if rootfs and Path(rootfs, ".complete").is_file() else f"no {ROOTFS_ENV}")
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"the real journal is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(f"real journal (systemd-nspawn): {missing}")
    assert rootfs is not None
    base = tmp_path_factory.mktemp("journal")
    test = base / "test"
    test.mkdir()
    (test / "crash.log").write_text(oom_death())
    (test / "crash.sh").write_text(CRASH_SCRIPT)
    (test / UNIT).write_text(CRASH_UNIT)
    booted = boot(
        Path(rootfs),
        machine=f"vllm-sidecar-journal-{uuid.uuid4().hex[:8]}",
        bus_dir=base / "bus",
        log_path=base / "container.log",
        options=("--volatile=overlay", f"--bind-ro={test}:/test"),
    )
    try:
        booted.run("systemctl", "link", f"/test/{UNIT}")
        # --no-block: the first invocation exits 1 at once, and `systemctl start` of a Type=exec unit then fails
        # when the exit beats the job's end (CI of 2026-12-01); the wait below is for what the test needs.
        booted.run("systemctl", "start", "--no-block", UNIT)
        # journald reads each invocation's stdout on a stream of its own: on a busy machine the second's line can
        # be in before the first's last ones (CI run 1 of 2026-11-30: the crash read without its OOM). Both, then.
        last_of_the_crash = json.dumps(oom_death().splitlines()[-1])[1:-1]
        deadline = time.monotonic() + 30
        while not all(line in (output := _entries(booted)) for line in ('"second start"', last_of_the_crash)):
            assert time.monotonic() < deadline, output
            time.sleep(0.1)
        yield booted
    finally:
        booted.stop()


def _entries(container: Container) -> str:
    # JSON: the unit printed bytes that are not UTF-8, which journalctl's plain output passes through as they are
    return container.run("journalctl", "--no-pager", f"--unit={UNIT}", "--output=json").stdout


def inside(container: Container, *prefix: str) -> tuple[str, ...]:
    return ("nsenter", f"--target={container.leader}", "--all", "--", *prefix, "journalctl")


async def test_the_invocation_that_died_is_read_whole_though_systemd_started_the_next(container: Container) -> None:
    journal = JournalLog(UNIT, command=inside(container))
    read = await journal.read(until_wall_s=time.time(), wanted=Wanted.DIED)
    assert read.where == f"journal of {UNIT} (system manager)"
    first, second = read.runs[-2:]
    assert first.ended == f"{UNIT}: Main process exited, code=exited, status=1/FAILURE"
    assert first.failed is True
    assert "\ufffd\ufffd not text" in first.text  # bytes that are not UTF-8 come back replaced, not dropped
    assert "second start" in second.text
    assert (second.ended, second.failed) == (None, None)
    cause = explain(read, Wanted.DIED, wall_time_s=time.time())
    assert (cause.cause, tuple(change.pasted for change in cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)
    invocation = container.unit_property(UNIT, "InvocationID")
    assert isinstance(invocation, bytes)
    assert first.label.startswith("invocation ")
    assert first.label != f"invocation {invocation.hex()}"
    assert second.label == f"invocation {invocation.hex()}"
    assert cause.evidence[-1] == f"how it ended: {first.ended}"
    # For a planned restart the newest start is read, unless it is still starting after one that crashed (no
    # failure, no serving line, not ended: systemd's Restart= started it into the same failure, likely): then
    # the crashed one, as the doctor reads a file that ends so.
    newest = explain(read, Wanted.LAST, wall_time_s=time.time())
    assert (newest.cause, newest.crashed) == (OOM_CAUSE, True)
    assert invocation.hex() not in newest.source
    assert first.label in newest.source


async def test_until_leaves_out_what_the_unit_printed_after(container: Container) -> None:
    # The bound: one microsecond before the journal's own time of "second start". Not the unit's
    # ExecMainStartTimestamp: systemd takes that in the manager after the fork, and on a busy machine the new
    # process can print first (seen in CI).
    (printed_us,) = (
        int(entry["__REALTIME_TIMESTAMP"])
        for entry in map(json.loads, _entries(container).splitlines())
        if entry.get("MESSAGE") == "second start"
    )
    read = await JournalLog(UNIT, command=inside(container)).read(
        until_wall_s=(printed_us - 1) / 1e6, wanted=Wanted.DIED
    )
    assert all("second start" not in run.text for run in read.runs)
    assert any("CUDA out of memory" in run.text for run in read.runs)


async def test_the_byte_bound_keeps_the_newest_entries(container: Container) -> None:
    read = await JournalLog(UNIT, command=inside(container), max_bytes=2048).read(
        until_wall_s=time.time(), wanted=Wanted.DIED
    )
    text = "\n".join(run.text for run in read.runs)
    assert len(text.encode()) <= 2048
    assert "second start" in text


async def test_a_user_outside_group_systemd_journal_is_told_what_to_change(container: Container) -> None:
    journal = JournalLog(UNIT, command=inside(container, *NOBODY))
    with pytest.raises(LogUnreadableError) as caught:
        await journal.read(until_wall_s=time.time(), wanted=Wanted.DIED)
    assert str(caught.value) == (
        "journalctl exited with 1: No journal files were opened due to insufficient permissions.; " + GROUP_HINT
    )


async def test_a_sandboxed_member_of_group_systemd_journal_reads_it(container: Container) -> None:
    """As the shipped unit runs the sidecar: another user, in group systemd-journal, with ProtectKernelTunables=
    and ProtectControlGroups=, under which a container's service sees the host's boot ID in /proc (so
    `journalctl --boot` would find nothing; the reader keeps the newest entry's boot instead)."""
    sandboxed = inside(
        container,
        *("systemd-run", "--quiet", "--wait", "--pipe", "--property=User=nobody"),
        *("--property=SupplementaryGroups=systemd-journal", "--property=ProtectKernelTunables=yes"),
        "--property=ProtectControlGroups=yes",
    )
    read = await JournalLog(UNIT, command=sandboxed).read(until_wall_s=time.time(), wanted=Wanted.DIED)
    cause = explain(read, Wanted.DIED, wall_time_s=time.time())
    assert (cause.cause, tuple(change.pasted for change in cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)


async def test_a_unit_that_never_logged(container: Container) -> None:
    with pytest.raises(LogUnreadableError) as caught:
        await JournalLog("never.service", command=inside(container)).read(until_wall_s=time.time(), wanted=Wanted.DIED)
    assert str(caught.value) == "no entries of never.service in the journal"


async def test_a_machine_without_a_journal() -> None:
    """Here PID 1 is not systemd and no journald runs (on a machine with a journal: no entries of the unit)."""
    with pytest.raises(LogUnreadableError) as caught:
        await JournalLog("vllm-sidecar-test-nothing.service").read(until_wall_s=time.time(), wanted=Wanted.DIED)
    assert str(caught.value).startswith("no entries of vllm-sidecar-test-nothing.service in the journal")


async def test_a_user_manager_without_journald_leaves_no_journal(user_systemd: UserSystemd) -> None:
    """What the sandboxed user manager of the other tests gives: its units' output goes to no journal."""
    unit = f"echo-{uuid.uuid4().hex[:8]}.service"
    user_systemd.write_unit(unit, "[Service]\nType=exec\nExecStart=/bin/sh -c 'echo hello; sleep 30'\n")
    user_systemd.call("StartUnit", "ss", unit, "replace")
    try:
        command = ("nsenter", f"--target={user_systemd.process.pid}", "--mount", "--", "journalctl")
        with pytest.raises(LogUnreadableError) as caught:
            await JournalLog(unit, bus="user", command=command).read(until_wall_s=time.time(), wanted=Wanted.DIED)
    finally:
        user_systemd.call("StopUnit", "ss", unit, "replace")
    assert str(caught.value) == f"no entries of {unit} in the journal (journalctl: No journal files were found.)"


# --- journalctl's behaviour, scripted: what the real one does not do on demand ---------------------------------


def fake_journalctl(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "journalctl.py"
    script.write_text("import json, os, sys, time\n" + body)
    return (sys.executable, str(script))


def test_the_command_line() -> None:
    system = JournalLog("vllm.service").argv(1_795_000_000.25)
    assert system == [
        *("journalctl", "--no-pager", "--unit=vllm.service", "--until=@1795000000.250000", "--reverse"),
        *("--lines=5000", "--output=json"),
        "--output-fields=MESSAGE,MESSAGE_ID,_BOOT_ID,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,USER_INVOCATION_ID",
    ]
    assert "--user-unit=vllm.service" in JournalLog("vllm.service", bus="user").argv(0.0)
    with pytest.raises(ValueError, match="unit"):
        JournalLog("--all")


async def test_a_slow_journalctl_is_cut_short_and_killed(tmp_path: Path) -> None:
    """The caller's deadline cancels the read: the process is killed and reaped, not left running."""
    pid_file = tmp_path / "pid"
    command = fake_journalctl(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    reading = asyncio.ensure_future(
        JournalLog("vllm.service", command=command).read(until_wall_s=0.0, wanted=Wanted.DIED)
    )
    async with asyncio.timeout(30):
        while not pid_file.is_file() or not pid_file.read_text():  # noqa: ASYNC110 - a file, not an event, says it
            await asyncio.sleep(0.02)
    reading.cancel()  # what asyncio.timeout does at the deadline
    with pytest.raises(asyncio.CancelledError):
        await reading
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_endless_output_stops_at_the_bound_and_keeps_the_newest(tmp_path: Path) -> None:
    body = (
        "i = 0\n"
        "while True:\n"
        "    print(json.dumps({'MESSAGE': f'line {i}', '_SYSTEMD_INVOCATION_ID': 'a'}), flush=True)\n"
        "    i += 1\n"
    )
    journal = JournalLog("vllm.service", command=fake_journalctl(tmp_path, body), max_entries=1000)
    async with asyncio.timeout(20):
        read = await journal.read(until_wall_s=0.0, wanted=Wanted.DIED)
    (run,) = read.runs
    lines = run.text.splitlines()
    assert lines[-1] == "line 0"  # newest first from journalctl (--reverse): "line 0" is the newest
    assert len(lines) <= 1000


async def test_lines_that_are_not_entries_are_skipped(tmp_path: Path) -> None:
    body = (
        "print('not json')\nprint('[1, 2]')\nprint(json.dumps({'MESSAGE_ID': 'x'}))\n"
        "print(json.dumps({'MESSAGE': None}))\nprint(json.dumps({'MESSAGE': [104, 105]}))\n"
        "print(json.dumps({'MESSAGE': [999]}))\nprint(json.dumps({'MESSAGE': 'newest'}))\n"
    )
    read = await JournalLog("vllm.service", command=fake_journalctl(tmp_path, body)).read(
        until_wall_s=0.0, wanted=Wanted.DIED
    )
    assert [run.text for run in read.runs] == ["newest\nhi"]  # oldest first again; [999] is no byte


async def test_only_the_newest_boot_counts(tmp_path: Path) -> None:
    """Newest first: once the boot changes, the rest is an earlier boot's (its last invocation did not just die)."""
    body = (
        "for boot, message in (('b2', 'now'), ('b2', 'earlier today'), ('b1', 'yesterday')):\n"
        "    print(json.dumps({'MESSAGE': message, '_BOOT_ID': boot, '_SYSTEMD_INVOCATION_ID': boot}))\n"
    )
    read = await JournalLog("vllm.service", command=fake_journalctl(tmp_path, body)).read(
        until_wall_s=0.0, wanted=Wanted.DIED
    )
    assert [(run.label, run.text) for run in read.runs] == [("invocation b2", "earlier today\nnow")]


async def test_a_failing_journalctl_says_what_it_said(tmp_path: Path) -> None:
    body = "sys.stderr.write('Failed to open journal: Bad message\\n  (details)\\n')\nsys.exit(3)\n"
    with pytest.raises(LogUnreadableError) as caught:
        await JournalLog("vllm.service", command=fake_journalctl(tmp_path, body)).read(
            until_wall_s=0.0, wanted=Wanted.DIED
        )
    assert str(caught.value) == "journalctl exited with 3: Failed to open journal: Bad message (details)"


async def test_no_journalctl_at_all() -> None:
    with pytest.raises(LogUnreadableError) as caught:
        await JournalLog("vllm.service", command=("/nonexistent/journalctl",)).read(
            until_wall_s=0.0, wanted=Wanted.DIED
        )
    assert str(caught.value) == "cannot run /nonexistent/journalctl: No such file or directory"
