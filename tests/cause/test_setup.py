"""Where the daemon reads why vLLM died, per restart adapter and setting, and how /status shows it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.journal_log import JournalLog
from sidecar.actuators.kube_command import PodSpecCommand
from sidecar.actuators.kube_logs import PodLog
from sidecar.model.acting import ActingView
from sidecar.model.cause import CrashCause, FlagChange
from sidecar.report.document import policy_document
from sidecar.shell.acting_setup import build_acting_parts
from sidecar.shell.settings import ENV_PREFIX, SettingsError, load_settings
from tests.loopback import nowhere_kubeconfig


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)


def test_systemd_reads_the_units_journal_and_a_file_overrides_it(tmp_path: Path) -> None:
    parts = build_acting_parts(load_settings({"actuator": "systemd", "systemd_unit": "vllm-a.service"}))
    assert isinstance(parts.vllm_log, JournalLog)
    assert (parts.vllm_log.unit, parts.vllm_log.bus) == ("vllm-a.service", "system")
    user = build_acting_parts(load_settings({"actuator": "systemd", "systemd_bus": "user"}))
    assert isinstance(user.vllm_log, JournalLog)
    assert user.vllm_log.where == "journal of vllm.service (user manager)"
    log = tmp_path / "vllm.log"
    parts = build_acting_parts(load_settings({"actuator": "systemd", "vllm_log": str(log)}))
    assert isinstance(parts.vllm_log, FileLog)
    assert parts.vllm_log.path == log


def test_exec_and_none_read_the_file_given_and_nothing_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert build_acting_parts(load_settings({"actuator": "exec", "exec_command": "true"})).vllm_log is None
    assert build_acting_parts(load_settings({})).vllm_log is None
    monkeypatch.setenv(ENV_PREFIX + "VLLM_LOG", str(tmp_path / "from-env.log"))
    parts = build_acting_parts(load_settings({"actuator": "exec", "exec_command": "true"}))
    assert isinstance(parts.vllm_log, FileLog)
    assert parts.vllm_log.where == f"file {tmp_path / 'from-env.log'}"


def test_kubernetes_reads_the_named_container_of_its_own_pod(tmp_path: Path) -> None:
    kubeconfig = nowhere_kubeconfig(tmp_path)
    settings = load_settings(
        {"actuator": "kubernetes", "kubeconfig": str(kubeconfig), "pod_name": "vllm-0", "vllm_container": "engine"}
    )
    parts = build_acting_parts(settings)
    assert isinstance(parts.vllm_log, PodLog)
    assert (parts.vllm_log.pod, parts.vllm_log.namespace, parts.vllm_log.container) == ("vllm-0", "ml", "engine")
    # vLLM's command line as the same container in the same pod's spec declares it
    declared = getattr(parts.declared_command, "__self__", None)
    assert isinstance(declared, PodSpecCommand)
    assert (declared.pod, declared.namespace, declared.container) == ("vllm-0", "ml", "engine")
    assert load_settings({}).vllm_container == "vllm"


def test_a_container_name_kubernetes_would_refuse_is_one_line() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"vllm_container": "vLLM_main"})
    assert str(caught.value).startswith("invalid setting vllm_container='vLLM_main': container name 'vLLM_main' is not")
    assert str(caught.value).endswith("(flag --vllm-container)")  # the layer it came from: the flag


def test_status_shows_the_last_cause_with_when_and_where() -> None:
    view = ActingView(
        state="cooldown",
        states=("cooldown",),
        admission_paused=False,
        ready=True,
        readiness_reason="ready",
        decision_reason="r",
        would_restart_but=None,
        cooldown_remaining_s=None,
        restarts_in_budget_window=1,
        restart_budget_remaining=2,
        last_restart_wall_time_s=None,
        dry_run=False,
        actuator="systemd",
    )
    assert policy_document(view)["crash_cause"] is None
    cause = CrashCause(
        cause="kv_cache_blowout",
        severity="critical",
        summary="vLLM could not start",
        evidence=("vLLM refused to start",),
        recommendations=(FlagChange(flag="--max-model-len", value=992, why="fits", pasted="--max-model-len 992"),),
        source="journal of vllm.service (system manager), invocation 1, 150 lines",
        read_wall_time_s=1_795_000_000.5,
    )
    document = policy_document(dataclasses.replace(view, crash_cause=cause))
    assert document["crash_cause"] == {
        "cause": "kv_cache_blowout",
        "severity": "critical",
        "summary": "vLLM could not start",
        "evidence": ["vLLM refused to start"],
        "recommendations": [{"flag": "--max-model-len", "value": 992, "why": "fits"}],
        "steps": [],
        "source": "journal of vllm.service (system manager), invocation 1, 150 lines",
        "read_timestamp_seconds": 1_795_000_000.5,
    }
