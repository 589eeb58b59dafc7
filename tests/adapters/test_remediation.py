"""--remediate in the shell: a real refused start of vLLM 0.32 (its log file, read by the doctor) turned into a
change of the flags file, the restart that applies it, the change confirmed or reverted, and the command a
person takes it back with. Real files in a temporary state dir; the clock is the test's."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import structlog

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.remediation_record import RecordError
from sidecar.cli import main
from sidecar.model.remediation import StepState
from sidecar.notify.message import Notification, NotificationKind
from sidecar.policy.decision import RestartReason
from sidecar.policy.remediation import parse_allowances
from sidecar.shell.remediating import RemediationSettings, Remediator
from sidecar.shell.remediation_store import RemediationStore

REFUSED = Path(__file__).resolve().parents[1] / "doctor" / "logs" / "vllm-0.32-cpu-refused.log"
STARTED = Path(__file__).resolve().parents[1] / "doctor" / "logs" / "vllm-0.32-cpu-started.log"
# vLLM's own estimate in that log is 992 tokens; 992 is a multiple of the block size (16 by default): the doctor's
# value, and what the flags file must hold.
FITS = 992


class Harness:
    def __init__(self, tmp_path: Path, *, dry_run: bool = False, allowed: str = "max-model-len=256..4096") -> None:
        self.log = tmp_path / "vllm.log"
        shutil.copy(REFUSED, self.log)
        self.store = RemediationStore(tmp_path / "state")
        self.now = 0.0
        self.notes: list[Notification] = []
        self.restarts: list[str] = []
        self.remediator = Remediator(
            RemediationSettings(
                allowances=parse_allowances(allowed), max_per_day=3, window_s=600.0, start_timeout_s=300.0
            ),
            target=self.store,
            source=FileLog(self.log),
            notify=self.notes.append,
            logger=structlog.get_logger(),
            dry_run=dry_run,
            clock=lambda: self.now,
            wall_clock=lambda: 1_750_000_000.0 + self.now,
        )
        self.remediator.restart = self._restart

    def _restart(self, text: str) -> bool:
        self.restarts.append(text)
        return True

    async def tick(self, at: float, *, healthy: bool) -> None:
        if at == 0:
            await self.remediator.load()
        self.now = at
        self.remediator.observe(healthy=healthy, now_s=at)
        # The read or the settling a tick began, awaited so the test is exact.
        for task in (self.remediator._check, self.remediator._settling):
            if task is not None:
                await task


async def test_a_refused_start_gets_the_doctors_max_model_len_and_a_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.tick(0, healthy=False)
    await h.tick(29, healthy=False)
    assert not h.store.flags_path.exists()  # not healthy for less than 30 s: vLLM may still be loading
    await h.tick(30, healthy=False)
    assert h.store.flags_path.read_text().splitlines()[-1] == f'VLLM_SIDECAR_FLAGS="--max-model-len {FITS}"'
    assert h.restarts == [f"--max-model-len 2048 -> {FITS} for kv_cache_blowout"]
    [note] = h.notes
    assert note.kind is NotificationKind.REMEDIATION
    assert note.reason == "remediation_applied"
    assert note.summary.startswith(f"set --max-model-len 2048 -> {FITS} for vLLM's next start (kv_cache_blowout: ")
    assert "restarting vLLM with it" in note.summary
    record = json.loads(h.store.record_path.read_text())
    assert [s["state"] for s in record["steps"]] == ["pending"]
    # The same refused start read again (the new one has not logged yet) changes nothing more.
    await h.tick(60, healthy=False)
    assert (len(h.restarts), len(h.store.steps())) == (1, 1)
    # vLLM serves with it: confirmed once healthy through the window.
    await h.tick(90, healthy=True)
    await h.tick(689, healthy=True)
    assert h.store.steps()[0].state is StepState.PENDING
    await h.tick(690, healthy=True)
    [step] = h.store.steps()
    assert step.state is StepState.CONFIRMED
    assert step.outcome == f"confirmed: vLLM healthy for 600 seconds with --max-model-len 2048 -> {FITS}"
    assert h.remediator.outcomes == {("--max-model-len", "applied"): 1, ("--max-model-len", "confirmed"): 1}


async def test_the_same_refusal_with_the_new_value_reverts_and_holds_the_flag(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.tick(0, healthy=False)
    await h.tick(30, healthy=False)
    # The next start ran with the doctor's value and was refused the same way (with less room still).
    refused_again = REFUSED.read_text().replace("max seq len (2048)", f"max seq len ({FITS})")
    h.log.write_text(refused_again.replace("maximum model length is 992", "maximum model length is 480"))
    await h.tick(60, healthy=False)
    [step] = h.store.steps()
    assert (step.state, step.held) == (StepState.REVERTED, True)
    assert step.outcome == f"reverted: kv_cache_blowout is back with --max-model-len {FITS}: a person must decide"
    assert h.store.flags_path.read_text().splitlines()[-1] == 'VLLM_SIDECAR_FLAGS=""'
    assert h.restarts[-1].startswith("--max-model-len reverted")
    # Held: the next refusal is refused with a reason, said once.
    await h.tick(90, healthy=False)
    await h.tick(120, healthy=False)
    refusals = [n for n in h.notes if n.reason == "remediation_refused"]
    assert len(refusals) == 1
    assert "held since a change to it was reverted" in refusals[0].summary


async def test_not_healthy_within_the_start_timeout_reverts(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.tick(0, healthy=False)
    await h.tick(30, healthy=False)
    shutil.copy(STARTED, h.log)  # a start that is loading, not crashed: nothing to judge from the log
    await h.tick(329, healthy=False)
    assert h.store.steps()[0].state is StepState.PENDING
    await h.tick(330, healthy=False)
    [step] = h.store.steps()
    assert step.state is StepState.REVERTED
    assert step.outcome.startswith(f"reverted: vLLM not healthy within 300 seconds of --max-model-len 2048 -> {FITS}")


async def test_before_a_restart_of_its_own_the_change_rides_on_that_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.remediator.load()
    await h.remediator.before_restart(RestartReason.ENGINE_DEAD)
    assert [s.after for s in h.store.steps()] == [FITS]
    assert h.restarts == []  # the restart under way applies it
    assert "the restart under way applies it" in h.notes[0].summary


async def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path, dry_run=True)
    await h.tick(0, healthy=False)
    await h.tick(30, healthy=False)
    assert not h.store.flags_path.exists()
    assert not h.store.record_path.exists()
    assert h.restarts == []
    assert [n.reason for n in h.notes] == ["remediation_would_apply"]
    assert h.remediator.outcomes == {("--max-model-len", "would_apply"): 1}


async def test_a_person_reverts_and_releases_with_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = Harness(tmp_path)
    await h.tick(0, healthy=False)
    await h.tick(30, healthy=False)
    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["remediations", "list", *state]) == 0
    listed = capsys.readouterr().out
    assert f"--max-model-len 2048 -> {FITS}  (kv_cache_blowout)  pending" in listed
    assert await asyncio.to_thread(main, ["remediations", "revert", *state]) == 0
    assert "reverted and held: --max-model-len" in capsys.readouterr().out
    assert h.store.flags_path.read_text().splitlines()[-1] == 'VLLM_SIDECAR_FLAGS=""'
    # The daemon, meanwhile, does not settle the step a person took back.
    await h.tick(100, healthy=True)
    await h.tick(700, healthy=True)
    [step] = h.store.steps()
    assert step.outcome == "reverted: by a person (vllm-sidecar remediations revert)"
    assert main(["remediations", "release", "max-model-len", *state]) == 0
    assert not h.store.steps()[0].held
    assert main(["remediations", "release", "max-model-len", *state]) == 1
    capsys.readouterr()
    assert main(["remediations", "list", "--json", *state]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["flags"] == {}
    assert [(s["change"], s["state"], s["held"]) for s in document["steps"]] == [
        (f"--max-model-len 2048 -> {FITS}", "reverted", False)
    ]


def test_a_record_that_cannot_be_read_changes_nothing(tmp_path: Path) -> None:
    store = RemediationStore(tmp_path)
    store.record_path.write_text('{"version": 1, "steps": [{"flag": 3}]}')
    with pytest.raises(RecordError, match=r"steps\.0"):
        store.steps()
