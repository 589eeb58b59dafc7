"""--remediate in the shell: a real refused start of vLLM 0.32 (its log file, read by the doctor) turned into a
change of the flags file, the restart that applies it, the change confirmed or reverted, and the command a
person takes it back with. Real files in a temporary state dir; the clock is the test's. Then a target whose write
restarts vLLM by itself (the Kubernetes Deployment's, in memory here; on a real API server in
tests/actuators/test_kube_flags_apiserver.py): no restart asked for, and acting's own restart given way."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.actuators.file_log import FileLog
from sidecar.actuators.kube_flags import DeploymentFlags
from sidecar.actuators.remediation_record import RecordError
from sidecar.cli import main
from sidecar.model.remediation import Step, StepState
from sidecar.model.supervision import Restarter, Supervision
from sidecar.notify.message import Notification, NotificationKind
from sidecar.policy.decision import RestartReason
from sidecar.policy.machine import Policy
from sidecar.policy.remediation import parse_allowances
from sidecar.policy.settings import PolicySettings
from sidecar.shell.acting import Acting
from sidecar.shell.acting_setup import build_acting_parts
from sidecar.shell.remediating import RemediationSettings, Remediator
from sidecar.shell.remediation_setup import build_remediator
from sidecar.shell.remediation_store import FlagsTarget, RemediationStore
from sidecar.shell.settings import ENV_PREFIX, SettingsError, load_settings
from sidecar.shell.state_file import StateFile
from tests.loopback import nowhere_kubeconfig

REFUSED = Path(__file__).resolve().parents[1] / "doctor" / "logs" / "vllm-0.32-cpu-refused.log"
STARTED = Path(__file__).resolve().parents[1] / "doctor" / "logs" / "vllm-0.32-cpu-started.log"
# vLLM's own estimate in that log is 992 tokens; 992 is a multiple of the block size (16 by default): the doctor's
# value, and what the flags file must hold.
FITS = 992


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        *,
        dry_run: bool = False,
        allowed: str = "max-model-len=256..4096",
        target: FlagsTarget | None = None,
    ) -> None:
        self.log = tmp_path / "vllm.log"
        if not self.log.exists():
            shutil.copy(REFUSED, self.log)
        self.store = RemediationStore(tmp_path / "state")
        self.now = 0.0
        self.notes: list[Notification] = []
        self.restarts: list[str] = []
        self.remediator = Remediator(
            RemediationSettings(
                allowances=parse_allowances(allowed), max_per_day=3, window_s=600.0, start_timeout_s=300.0
            ),
            target=self.store if target is None else target,
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
    assert await asyncio.to_thread(main, ["remediations", "list", *state]) == 0
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
    assert await asyncio.to_thread(main, ["remediations", "release", "max-model-len", *state]) == 0
    assert not h.store.steps()[0].held
    assert await asyncio.to_thread(main, ["remediations", "release", "max-model-len", *state]) == 1
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["remediations", "list", "--json", *state]) == 0
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


# --- a target whose write restarts vLLM by itself (Kubernetes: the Deployment's rollout) ------------------------


class RollingTarget:
    """In memory, shaped like the Kubernetes target: writing changed flags rolls the Deployment's pods out."""

    restarts_on_change = True
    where = "Deployment vllm in namespace ml, container vllm's args"

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.writes = 0

    async def read(self) -> list[Step]:
        return list(self.steps)

    async def update(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        self.steps = edit(list(self.steps))
        self.writes += 1
        return list(self.steps)


async def test_where_writing_restarts_vllm_no_restart_is_asked_and_the_new_pod_judges(tmp_path: Path) -> None:
    target = RollingTarget()
    h = Harness(tmp_path, target=target)
    await h.tick(0, healthy=False)
    await h.tick(30, healthy=False)
    [step] = target.steps
    assert (step.after, step.state) == (FITS, StepState.PENDING)
    assert h.restarts == []  # the rollout is the restart: another would replace the new pod again
    [note] = h.notes
    assert note.summary.endswith("; writing it restarts vLLM with it")
    assert note.details["flags_file"] == target.where
    # The pod that wrote it crash-loops until the rollout replaces it: its vLLM never runs with the change, so
    # it neither reverts it at the start timeout nor judges its own crashes by it.
    for at in (60, 330, 400, 700):
        await h.tick(at, healthy=False)
    assert [(s.state, s.after) for s in target.steps] == [(StepState.PENDING, FITS)]
    assert (h.restarts, target.writes) == ([], 1)
    # The new pod's sidecar loads the record with the change pending and confirms it.
    new_pod = Harness(tmp_path, target=target)
    await new_pod.tick(0, healthy=True)
    await new_pod.tick(600, healthy=True)
    [step] = target.steps
    assert step.state is StepState.CONFIRMED
    assert new_pod.restarts == []


async def test_where_writing_restarts_vllm_a_revert_asks_for_no_restart_either(tmp_path: Path) -> None:
    target = RollingTarget()
    writer = Harness(tmp_path, target=target)
    await writer.tick(0, healthy=False)
    await writer.tick(30, healthy=False)
    new_pod = Harness(tmp_path, target=target)
    await new_pod.tick(0, healthy=False)
    await new_pod.tick(300, healthy=False)  # not healthy within the start timeout
    [step] = target.steps
    assert step.state is StepState.REVERTED
    assert new_pod.restarts == []  # writing the revert rolls the pods out again


async def test_before_a_restart_of_its_own_the_write_takes_that_restarts_place(tmp_path: Path) -> None:
    target = RollingTarget()
    h = Harness(tmp_path, target=target)
    await h.remediator.load()
    instead = await h.remediator.before_restart(RestartReason.ENGINE_DEAD)
    assert instead == f"vLLM's flags changed in {target.where}: that write restarts vLLM with them"
    assert [s.after for s in target.steps] == [FITS]
    assert h.restarts == []
    # Nothing new to write (the change is pending): the adapter's restart goes ahead as decided.
    assert await h.remediator.before_restart(RestartReason.ENGINE_DEAD) is None


async def test_on_the_files_the_restart_under_way_still_happens(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.remediator.load()
    assert await h.remediator.before_restart(RestartReason.ENGINE_DEAD) is None
    assert [s.after for s in h.store.steps()] == [FITS]


class RecordingActuator:
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        self.calls.append(reason)
        return ActuatorOutcome(status=OutcomeStatus.DONE, detail="restarted", duration_s=0.0)

    async def supervision(self) -> Supervision:
        return Supervision(restarter=Restarter.UNKNOWN, detail="")

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("instead", [None, "vLLM's flags changed in Deployment vllm: that write restarts vLLM"])
async def test_acting_skips_its_adapter_when_the_flags_write_restarted_vllm(
    tmp_path: Path, instead: str | None
) -> None:
    adapter = RecordingActuator()
    acting = Acting(
        policy=Policy(PolicySettings()),
        actuator=adapter,
        ledger_file=StateFile(tmp_path / "ledger.json"),
        notify=lambda _note: None,
        logger=structlog.get_logger(),
        dry_run=False,
    )
    asked: list[RestartReason] = []

    async def before_restart(reason: RestartReason) -> str | None:
        asked.append(reason)
        return instead

    acting.before_restart = before_restart
    await acting._restart(RestartReason.ENGINE_DEAD, "engine dead", "restarting")
    assert asked == [RestartReason.ENGINE_DEAD]
    assert adapter.calls == ([] if instead else ["engine_dead: engine dead"])
    assert acting.restarts == {"engine_dead": 1}  # counted either way: vLLM was restarted


def test_on_kubernetes_the_remediator_writes_to_the_deployment_that_owns_the_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    kubeconfig = nowhere_kubeconfig(tmp_path)
    values = {"kubeconfig": str(kubeconfig), "pod_name": "vllm-0", "vllm_container": "engine"}
    values |= {"remediate": "max-model-len=256..4096", "state_dir": str(tmp_path)}
    settings = load_settings({"actuator": "kubernetes", **values})
    parts = build_acting_parts(settings)
    assert isinstance(parts.flags_target, DeploymentFlags)
    assert (parts.flags_target.pod, parts.flags_target.namespace) == ("vllm-0", "ml")
    assert parts.flags_target.container == "engine"
    remediator = build_remediator(
        settings,
        logger=structlog.get_logger(),
        log_source=parts.vllm_log,
        notify=lambda _note: None,
        flags_target=parts.flags_target,
    )
    assert remediator is not None
    assert remediator.target is parts.flags_target
    assert remediator.target.restarts_on_change
    assert remediator.view().flags_file == "the Deployment owning pod vllm-0 in namespace ml, container engine's args"
    # Events only, no restart adapter: nothing to apply the flags.
    events_only = load_settings({"actuator": "none", "kubernetes_events": True, **values})
    assert build_acting_parts(events_only).flags_target is None
    with pytest.raises(SettingsError, match="needs --actuator systemd, exec or kubernetes"):
        build_remediator(events_only, logger=structlog.get_logger(), log_source=None, notify=lambda _note: None)
