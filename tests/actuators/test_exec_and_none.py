"""The exec adapter runs a real argv without a shell; the none adapter refuses clearly."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.exec import ExecActuator
from sidecar.actuators.none import NoActuator


async def test_success_reports_the_last_line_and_passes_the_reason(tmp_path: Path) -> None:
    script = "import os; print('restarting'); print('done: ' + os.environ['VLLM_SIDECAR_RESTART_REASON'])"
    outcome = await ExecActuator([sys.executable, "-c", script]).restart(reason="engine_hung", dry_run=False)
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.detail.endswith("succeeded: done: engine_hung")


async def test_no_shell_is_involved(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    outcome = await ExecActuator(["echo", f"x; touch {marker}"]).restart(reason="r", dry_run=False)
    assert outcome.status is OutcomeStatus.DONE
    assert not marker.exists()


async def test_failure_missing_program_and_timeout() -> None:
    failed = await ExecActuator([sys.executable, "-c", "print('boom'); raise SystemExit(3)"]).restart(
        reason="r", dry_run=False
    )
    assert failed.status is OutcomeStatus.FAILED
    assert "exited with 3: boom" in failed.detail
    missing = await ExecActuator(["/nonexistent/restart-vllm"]).restart(reason="r", dry_run=False)
    assert missing.status is OutcomeStatus.FAILED
    assert "cannot run /nonexistent/restart-vllm" in missing.detail
    started = time.monotonic()
    slow = await ExecActuator(["sleep", "30"], timeout_s=0.5).restart(reason="r", dry_run=False)
    assert slow.status is OutcomeStatus.FAILED
    assert "did not finish within 0.5 s; killed" in slow.detail
    assert time.monotonic() - started < 5


async def test_dry_run_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    outcome = await ExecActuator(["touch", str(marker)]).restart(reason="r", dry_run=True)
    assert outcome.status is OutcomeStatus.DRY_RUN
    assert outcome.detail == f"would run touch {marker}"
    assert not marker.exists()


def test_an_empty_command_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        ExecActuator([])


async def test_none_refuses_clearly() -> None:
    outcome = await NoActuator().restart(reason="r", dry_run=False)
    assert outcome.status is OutcomeStatus.FAILED
    assert "observe and pause only" in outcome.detail
