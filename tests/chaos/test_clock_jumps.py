"""Wall-clock jumps under the real daemon: libfaketime (Debian package `faketime`) shifts its wall clock at run
time (file mode, read on every call), its monotonic clock untouched, as an NTP step or a VM resume does.

The engine is hung (a loopback vLLM with frozen counters and requests running) and the restart budget (2 an
hour) is spent by two restarts 3590 s ago, persisted in the ledger. So a restart is due and the budget says
wait about 10 s. Then:
- the wall clock jumps 2 h back: polling must go on (the scheduler reads the wall clock), and the budget must
  still free up after those 10 s (read by wall time alone, the old records would lie 1 h in the future and
  block restarts for 2 h);
- the restart happens (once), then the clock jumps 4 h forward: the budget must not reset (read by wall time
  alone, that restart would look 4 h old);
- the sidecar is killed and started again, still 2 h ahead: a new process has only the ledger, and must still
  count that restart (it ages records of this boot by the monotonic clock they carry);
- then 20 years forward (a host that booted with a dead RTC): polling must go on at once.
Skipped without libfaketime, failed in CI (`CI=true`).
"""

from __future__ import annotations

import glob
import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import required_in_ci

from .chaos import (
    VllmStandIn,
    assert_survived,
    counter_watch,
    named,
    policy,
    read_events,
    scrape,
    value,
    wait_polls,
    wait_until,
)

LIBFAKETIME = "/usr/lib/*/faketime/libfaketime.so.1"
HOUR_S = 3600.0
TWENTY_YEARS_S = 20 * 365 * 86400


def _libfaketime() -> str:
    found = sorted(glob.glob(LIBFAKETIME))
    if not found:
        reason = "libfaketime not found (Debian package faketime)"
        if required_in_ci():
            pytest.fail(f"{reason}: required in CI (CI=true)", pytrace=False)
        pytest.skip(reason)
    return found[0]


def _last_poll(sidecar: SidecarProcess) -> float | None:
    return value(scrape(sidecar), "vllm_sidecar_last_poll_timestamp_seconds")


def _polling_near(sidecar: SidecarProcess, wall_s: float) -> bool:
    """The daemon completed a poll stamped within 5 s of `wall_s` (its own, shifted, wall clock)."""
    last = _last_poll(sidecar)
    return last is not None and abs(last - wall_s) < 5.0


def _restarts_done(sidecar: SidecarProcess) -> int:
    actions = policy(sidecar)["actions"]
    assert isinstance(actions, dict), actions
    return int(actions.get("notify_restart_done", 0))


def test_wall_clock_jumps_neither_stall_polling_nor_reset_or_block_the_restart_budget(tmp_path: Path) -> None:
    library = _libfaketime()
    offset_file = tmp_path / "faketime"
    offset_file.write_text("+0\n")
    state = tmp_path / "state"
    state.mkdir()
    seeded_wall_s = time.time() - (HOUR_S - 10)
    ledger = {
        "version": 1,
        "restarts": [{"wall_time_s": seeded_wall_s, "reason": "engine_hung", "detail": "seeded"}] * 2,
    }
    (state / "restart-ledger.json").write_text(json.dumps(ledger))
    witness = tmp_path / "restarts"
    record = "import sys; open(sys.argv[1], 'a').write('restart\\n')"
    vllm = VllmStandIn(running=2.0, progress=False)  # requests running, counters frozen: a hung engine

    def start(name: str) -> SidecarProcess:
        return SidecarProcess(
            [
                *("--vllm-url", vllm.url, "--gpu-source", "none", "--interval", "0.5", "--state-dir", str(state)),
                *("--actuator", "exec", "--exec-command", shlex.join([sys.executable, "-c", record, str(witness)])),
                *("--max-restarts-per-hour", "2", "--hung-after", "1", "--drain-timeout", "1"),
                # The stand-in serves no /v1: the probe proves nothing, the stall alone decides.
                *("--hung-without-probe-after", "1"),
                *("--startup-timeout", "30"),
                # No incident folders: the stand-in vLLM is this test's own process, whose stacks py-spy would
                # read before each restart (up to --incident-timeout), a delay this test is not about.
                *("--incidents-keep", "0"),
            ],
            tmp_path / f"{name}.log",
            env={
                "LD_PRELOAD": library,
                "FAKETIME_TIMESTAMP_FILE": str(offset_file),
                "FAKETIME_NO_CACHE": "1",  # read the offset on every call: the test changes it at run time
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # an NTP step moves the wall clock only
            },
        )

    sidecar = first = start("first")
    figures: dict[str, float] = {}
    try:
        sidecar.wait_ready()
        with counter_watch(sidecar) as watch:
            wait_until(
                lambda: "restart budget exhausted" in str(policy(sidecar).get("would_restart_but")),
                15,
                "the hung engine's restart to be blocked by the spent budget",
            )
            assert not witness.exists()

            # 2 h back.
            offset_file.write_text("-7200\n")
            back_at = time.monotonic()
            figures["polling_after_backward_jump_s"] = wait_until(
                lambda: _polling_near(sidecar, time.time() - 7200), 10, "polls stamped 2 h back"
            )
            wait_until(witness.exists, 20, "the budget to free up (the old restarts leaving the hour) and a restart")
            figures["restart_after_backward_jump_s"] = time.monotonic() - back_at
            # Counted, not the current state: "cooldown" may last one poll, since the engine stays hung and the
            # next poll pauses admission again.
            wait_until(
                lambda: _restarts_done(sidecar) >= 1,
                20,
                "the restart to complete",
                lambda: f"; policy: {policy(sidecar)}; log tail: {sidecar.log_path.read_text()[-3000:]}",
            )
            assert value(scrape(sidecar), "vllm_sidecar_restart_budget_remaining") == 1.0

            # 4 h forward (2 h ahead of the real time): the restart just done still counts.
            offset_file.write_text("+7200\n")
            wait_until(lambda: _polling_near(sidecar, time.time() + 7200), 10, "polls stamped 2 h ahead")
            wait_polls(sidecar, 4)
            after_forward = scrape(sidecar)
            forward_policy = policy(sidecar)
        watch.assert_monotonic()
        assert_survived(first)

        # Killed and started again, 2 h ahead: the new process must count the restart from the ledger.
        first.process.kill()
        first.process.wait(timeout=10)
        sidecar = start("second")
        sidecar.wait_ready()
        with counter_watch(sidecar) as watch:
            wait_until(
                lambda: "would restart" in str(policy(sidecar).get("reason")),
                15,
                "the new sidecar to see the hung engine",
            )
            wait_polls(sidecar, 4)
            restarted_policy = policy(sidecar)
            restarted_remaining = value(scrape(sidecar), "vllm_sidecar_restart_budget_remaining")

            # 20 years forward: one poll at once, not a loop over every missed interval.
            offset_file.write_text(f"+{TWENTY_YEARS_S}\n")
            far_at = time.monotonic()
            figures["polling_after_20_year_jump_s"] = wait_until(
                lambda: _polling_near(sidecar, time.time() + TWENTY_YEARS_S), 10, "polls stamped 20 years ahead"
            )
            far_policy = policy(sidecar)
            healthz = sidecar.get("/healthz").status_code
        watch.assert_monotonic()
        assert_survived(sidecar)
    finally:
        offset_file.write_text("+0\n")
        first.kill()
        sidecar.kill()
        vllm.close()

    assert witness.read_text().splitlines() == ["restart"], "exactly one restart: the budget's one free slot"
    assert value(after_forward, "vllm_sidecar_restart_budget_remaining") == 1.0, "a forward jump reset the budget"
    assert forward_policy["restarts_in_budget_window"] == 1, forward_policy
    assert restarted_policy["restarts_in_budget_window"] == 1, restarted_policy
    assert restarted_remaining == 1.0, "a sidecar restarted after a forward jump got its budget back"
    assert far_policy["restarts_in_budget_window"] == 1, far_policy
    assert healthz == 200
    assert time.monotonic() - far_at < 30
    restarts = json.loads((state / "restart-ledger.json").read_text())["restarts"]
    assert len(restarts) == 3, restarts
    assert [r["detail"] for r in restarts[:2]] == ["seeded", "seeded"], restarts
    events = read_events(first.log_path) + read_events(sidecar.log_path)
    assert [e["action"] for e in named(events, "action") if e["action"] == "restart"] == ["restart"]
    jumps = [round(float(str(e["jump_s"])) / 3600) for e in named(read_events(first.log_path), "wall_clock_jumped")]
    assert jumps == [-2, 4], jumps
    print("\nwall-clock jumps:", ", ".join(f"{name} {seconds:.1f} s" for name, seconds in figures.items()))
