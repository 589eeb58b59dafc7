"""The simulator restarted underneath the sidecar by someone else while load runs through it: its counters
start again from 0 mid-flight. The sidecar must leave it to its supervisor (no action at all), never see a
stall (requests run before and after; a counter going down is a reset, not a standstill), and afterwards
report exactly what the new process's /metrics say. The real-vLLM version is in `test_real_vllm_chaos.py`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.adapters.daemon_process import SidecarProcess

from .chaos import (
    RESTART_SIM,
    CounterWatch,
    Load,
    SimUnderExec,
    assert_survived,
    engine_values_from_sidecar,
    engine_values_from_vllm,
    named,
    policy,
    read_events,
    scrape,
    value,
    wait_until,
)

SIM_ENGINE = {"engine": "0", "model_name": "sim-llama"}


def test_a_restart_underneath_under_load_is_a_counter_reset_not_a_stall(tmp_path: Path) -> None:
    sim = SimUnderExec(tmp_path / "sim", "healthy", "--decode-step-s", "0.02")
    witness = tmp_path / "sidecar-restarted"
    sidecar = SidecarProcess(
        [
            *("--vllm-url", sim.url, "--gpu-source", "sim", "--interval", "0.5"),
            *("--state-dir", str(tmp_path / "state")),
            *("--actuator", "exec", "--exec-command", shlex.join(["touch", str(witness)])),
            # Eager: a false stall (hung) or the short outage read as a dead engine would restart at once.
            *("--hung-after", "2", "--dead-after", "2"),
            *("--hung-without-probe-after", "2"),  # a false stall would restart at once: none may
        ],
        tmp_path / "sidecar.log",
    )
    load = Load(sim.url, clients=6, max_tokens=50, request_timeout_s=10)
    watch = CounterWatch(sidecar.url)
    stalls: list[float] = []

    def sample_stall() -> None:
        engines = sidecar.get("/status").json().get("engines") or []
        stalls.extend(float(engine["engine_stalled_seconds"] or 0.0) for engine in engines)

    try:
        sidecar.wait_ready()
        load.start()
        watch.start()
        wait_until(lambda: policy(sidecar)["state"] == "normal", 20, "the policy to reach normal")
        before = time.monotonic()
        while time.monotonic() - before < 2.0:
            sample_stall()
            time.sleep(0.2)
        # Someone else restarts it (as `systemctl restart` would): SIGKILL and a new process on the same port.
        subprocess.run([sys.executable, str(RESTART_SIM), str(sim.folder)], check=True, timeout=30)
        restarted = time.monotonic()
        while time.monotonic() - restarted < 5.0:
            sample_stall()
            time.sleep(0.2)
        load.stop()

        def agreed_at_rest() -> bool:
            own = engine_values_from_vllm(httpx.get(sim.url + "/metrics", timeout=5).text, **SIM_ENGINE)
            return own["requests_running"] == 0.0 and engine_values_from_sidecar(sidecar, **SIM_ENGINE) == own

        wait_until(agreed_at_rest, 20, "the load to finish and the sidecar to agree with the new simulator")
        final_policy = policy(sidecar)
        events = read_events(sidecar.log_path)
        metrics = scrape(sidecar)
        assert_survived(sidecar)
    finally:
        load.stop()
        watch.stop()
        sidecar.kill()
        sim.stop()
    watch.assert_monotonic()

    assert len(sim.restarts()) == 1  # the one made by "someone else"
    assert load.completed > 0
    assert not witness.exists(), "the sidecar restarted a vLLM its supervisor had just restarted"
    # Nothing acted on: at most its return is told, when a poll fell in the second it was gone.
    assert {e["action"] for e in named(events, "action")} <= {"notify_vllm_recovered"}, named(events, "action")
    assert max(stalls) == 0.0, f"a false stall across the counter reset: {max(stalls)} s"
    assert final_policy["state"] == "normal", final_policy
    assert value(metrics, "vllm_sidecar_up") == 1.0
