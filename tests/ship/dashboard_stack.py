"""Everything the Grafana dashboard reads, for real, on loopback: two simulated vLLM servers, two sidecar daemons,
load, and a Prometheus scraping all four every second. Also the command that redraws docs/img/dashboard.png.

    python -m tests.ship.dashboard_stack --png docs/img/dashboard.png [--seconds 90]

What runs, and why each part is there (every panel and annotation must have data):
- sim `leak` (vLLM 0.32 names) with a slow leak (32 MiB/s) and a small KV cache: GPU memory grows steadily, so
  growth and time to OOM exist (about 30 minutes of it, so nothing runs out), and 12 clients fill the KV cache
  past where the sidecar pauses admission, so it pauses and resumes again and again. `--max-num-seqs 10` keeps
  two of them waiting for capacity (vLLM's queue split by reason has data), and `--enable-fault-tolerance` shows
  `vllm:engine_healthy`.
- sim `healthy` as vLLM 0.6 (V0: `gpu_cache_usage_perc`, no engine label): the vLLM panels must work on both name
  schemes. Light load, so its histograms exist (V0 creates them on the first request).
- sidecar A on the leak sim, acting through the `exec` adapter with a script that fails once and then works,
  driven through the admin API: one failed and one successful restart, each draining (admission paused) first,
  each keeping an incident; with `--remediate` and a real refused start of vLLM as its `--vllm-log`, so the
  first restart sets the doctor's --max-model-len for the next start.
- sidecar B on the V0 sim, reading GPUs through the repository's pynvml fake that reports one Xid 79: no other
  way to show Xid errors without a failing GPU (tests/ship/fake_nvml_sidecar.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from grafana import render
from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port
from tests.scenarios.harness import SimProcess, start_loadtest
from tests.ship.probe_replay import ProbeReplay

from .prometheus_server import PrometheusServer

REPO = Path(__file__).resolve().parents[2]
REFUSED_LOG = REPO / "tests" / "doctor" / "logs" / "vllm-0.32-cpu-refused.log"
MIB = 1024 * 1024
ADMIN_TOKEN = "dashboard-stack-admin-token"  # noqa: S105 - a loopback test daemon's; the API wants 16+ characters
NEW_MODEL = "sim-llama"
OLD_MODEL = "sim-llama-v0"
XID = 79
# Small enough that the 10 running requests of ~1,100 tokens need ~95 % of it: admission pauses at the default 0.9,
# the readiness-gated load stops, and it resumes below 0.8, over and over. At 864 blocks they needed ~81 %, and a
# pause came only when chance lengthened the prompts (local run 36 of 2026-11-30: none in 75 s).
KV_BLOCKS = 720
MAX_NUM_SEQS = 10  # of the 12 clients: 2 wait for capacity
# 2 s, not 1: on a starved CI box a run of 1 s scrapes timing out left a gap longer than the panels' 4 s rate
# interval around the Xid, and no window held both sides of its counter's step (run 44: the Xid panel read 0).
SCRAPE_INTERVAL_S = 2.0
# Prometheus has stored every scrape that began this long ago (interval and timeout): an instant that old reads
# the same at any later query.
SETTLED_S = 2 * SCRAPE_INTERVAL_S

# The exec adapter's command: fails the first time (as a missing unit would), succeeds after.
RESTART_SCRIPT = """#!/bin/sh
if [ -e "{marker}" ]; then echo "vllm restarted"; exit 0; fi
touch "{marker}"
echo "unit vllm.service not found" >&2
exit 1
"""


class FakeNvmlSidecar(SidecarProcess):
    """SidecarProcess's waiting and stopping, for `python -m tests.ship.fake_nvml_sidecar`."""

    # Not SidecarProcess.__init__: that starts `-m sidecar run`. The fields it sets are set here instead.
    def __init__(self, args: list[str], log_path: Path, xid: int, xid_when: Path) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.ship.fake_nvml_sidecar"),
                *("--xid", str(xid), "--xid-when", str(xid_when), "--"),
                *("--listen", f"127.0.0.1:{self.port}", "--log-format", "json", *args),
            ],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )


class DashboardStack:
    """Start with start(), act with exercise(), wait for wait_complete(); stop() ends every process."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._stoppers: list[Callable[[], object]] = []
        self.prometheus: PrometheusServer | None = None
        self.sidecar: SidecarProcess | None = None
        self._xid_trigger = directory / "report-xid"
        self._xid_trigger.unlink(missing_ok=True)

    def start(self) -> PrometheusServer:
        d = self.directory
        leak = SimProcess(
            "leak",
            d / "sim-leak.log",
            *("--model-name", NEW_MODEL, "--num-gpu-blocks", str(KV_BLOCKS), "--max-num-seqs", str(MAX_NUM_SEQS)),
            *("--leak-bytes-per-request", "0", "--leak-bytes-per-s", str(32 * MIB)),
            *("--enable-fault-tolerance", "true"),
        )
        self._stoppers.append(leak.stop)
        old = SimProcess(
            "healthy", d / "sim-v0.log", "--vllm-version", "0.6", "--model-name", OLD_MODEL, "--num-gpu-blocks", "512"
        )
        self._stoppers.append(old.stop)
        token = d / "admin.token"
        token.write_text(ADMIN_TOKEN + "\n")
        token.chmod(0o600)
        script = d / "restart-vllm.sh"
        marker = d / "restart-failed-once"
        marker.unlink(missing_ok=True)  # a reused --workdir must fail its first restart again
        script.write_text(RESTART_SCRIPT.format(marker=marker))
        script.chmod(0o755)
        vllm_log = d / "vllm.log"
        vllm_log.write_bytes(REFUSED_LOG.read_bytes())
        probe = ProbeReplay(d / "probe")
        probe.start()
        self._stoppers.append(probe.stop)
        self.sidecar = SidecarProcess(
            [
                *("--vllm-url", leak.url, "--gpu-source", "sim", "--interval", "0.5", "--state-dir", str(d / "a")),
                # The allocator row's data; no pause for it, so sidecar A's pauses stay the KV cache's.
                *("--probe-dir", str(d / "probe"), "--pause-alloc-retries", "0"),
                *("--actuator", "exec", "--exec-command", str(script), "--admin-token-file", str(token)),
                *("--drain-timeout", "1", "--startup-timeout", "30"),
                # The remediation row: the "vLLM log" is a real refused start of vLLM 0.32, read before each
                # restart; the doctor's --max-model-len is set for the next start (and waits to prove itself).
                *("--vllm-log", str(vllm_log), "--remediate", "max-model-len=256..4096"),
            ],
            d / "sidecar-a.log",
        )
        self._stoppers.append(self.sidecar.kill)
        xid_sidecar = FakeNvmlSidecar(
            [*("--vllm-url", old.url, "--gpu-source", "nvml", "--interval", "1", "--state-dir", str(d / "b"))],
            d / "sidecar-b.log",
            XID,
            self._xid_trigger,
        )
        self._stoppers.append(xid_sidecar.kill)
        # Started before waiting on the others: its first scrape waits for a 5 s discovery tick anyway.
        self.prometheus = PrometheusServer(
            d / "prometheus",
            targets={
                "vllm-sidecar": [f"127.0.0.1:{self.sidecar.port}", f"127.0.0.1:{xid_sidecar.port}"],
                "vllm": [f"127.0.0.1:{leak.port}", f"127.0.0.1:{old.port}"],
            },
            scrape_interval=f"{SCRAPE_INTERVAL_S:g}s",
        )
        self._stoppers.append(self.prometheus.stop)
        leak.wait_healthy()
        old.wait_healthy()
        self.sidecar.wait_ready()
        xid_sidecar.wait_ready()
        # Sent only while sidecar A's /readyz admits, as a router would: its pauses show as load stopping.
        self._load(
            leak.url,
            *("--concurrency", "12", "--prompt-tokens", "uniform:600-1400", "--output-tokens", "128"),
            *("--readiness-url", self.sidecar.url + "/readyz"),
        )
        self._load(old.url, "--concurrency", "1", "--prompt-tokens", "200", "--output-tokens", "16")
        self.prometheus.wait_ready()
        self.prometheus.wait_targets_up()
        return self.prometheus

    def _load(self, url: str, *args: str) -> None:
        # Runs until stop(): the panels' rate windows must see requests until the very end.
        process = start_loadtest(url, *args, "--duration", "900", "--shared-prefix-ratio", "0.5")

        def stop() -> None:
            process.kill()
            process.communicate(timeout=10)  # reaps it and closes its pipes

        self._stoppers.append(stop)

    def exercise(self) -> None:
        """One failed and one successful manual restart of the leak sim's vLLM, each draining under load, and
        one Xid on sidecar B's GPU: all after Prometheus's first scrape, since a counter already at 1 when first
        scraped never shows an increase."""
        assert self.sidecar is not None, "start() first"
        self._xid_trigger.touch()
        self._restart()
        self._wait_metric(r'vllm_sidecar_action_failures_total\{action="restart"\} 1\.0', 30)
        # The failed restart latches FAILED; a manual restart clears it and starts over.
        self._restart()
        self._wait_metric(r'vllm_sidecar_restarts_total\{reason="manual"\} 1\.0', 30)
        self._wait_metric(r'vllm_sidecar_remediations_total\{flag="--max-model-len",outcome="applied"\} 1\.0', 30)

    def _restart(self) -> None:
        assert self.sidecar is not None
        response = httpx.post(
            self.sidecar.url + "/admin/restart", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5
        )
        # The admin API answers 200 with the policy's reason, which says when the restart was refused.
        if response.status_code != 200 or "refused" in response.text:
            raise RuntimeError(f"/admin/restart answered {response.status_code}: {response.text}")

    def _wait_metric(self, pattern: str, timeout_s: float) -> None:
        assert self.sidecar is not None
        wanted = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if wanted.search(self.sidecar.get("/metrics").text):
                return
            time.sleep(0.25)
        raise RuntimeError(f"sidecar A never exported {pattern!r}: {self.sidecar.log_path.read_text()[-3000:]}")

    def wait_complete(self, timeout_s: float = 60.0) -> float:
        """Until Prometheus holds every state the dashboard shows: the slowest is time to OOM, which needs 30 s
        of memory history in the sidecar. Returns the instant at which all of them held, every query evaluated
        at it: a state can come and go (the forecast flickers as the leak's trend moves), and a check that reads
        each at its own "now" passed in CI run 29 with time to OOM gone a moment later, at the window's end."""
        assert self.prometheus is not None
        wanted = {
            "time to OOM": "vllm_sidecar_gpu_time_to_oom_seconds",
            "a failed restart": 'vllm_sidecar_action_failures_total{action="restart"} > 0',
            "a manual restart": 'vllm_sidecar_restarts_total{reason="manual"} > 0',
            "an Xid": "vllm_sidecar_gpu_last_xid",
            # The pause annotation's state (cold CI run 48: no pause was stored in the window, and it went blank).
            "a pause of admission": "max_over_time(vllm_sidecar_admission_paused[10m]) > 0",
            "allocator retries": "increase(vllm_sidecar_torch_alloc_retries_total[1m]) > 0",
            "requests waiting, split by reason": "vllm_sidecar_requests_waiting_deferred_ratio",
            "TTFT on both vLLM versions": "count(count by (model_name) (vllm:time_to_first_token_seconds_count)) == 2",
        }
        deadline = time.monotonic() + timeout_s
        missing = list(wanted)
        while time.monotonic() < deadline:
            at = time.time() - SETTLED_S
            missing = [what for what, expr in wanted.items() if not self.prometheus.query(expr, at=at)]
            if not missing:
                return at
            time.sleep(1)
        raise RuntimeError(f"Prometheus still lacks {missing} after {timeout_s} s")

    def stop(self) -> None:
        for stop in reversed(self._stoppers):
            try:
                stop()
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                sys.stderr.write(f"while stopping the dashboard stack: {error}\n")
        self._stoppers.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "dashboard.png")
    parser.add_argument("--seconds", type=float, default=90.0, help="history the picture shows (the stack needs ~35 s)")
    parser.add_argument("--workdir", type=Path, default=None, help="where logs and data go (default: a temp dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dashboard-stack-") as scratch:
        stack = DashboardStack(args.workdir or Path(scratch))
        try:
            prometheus = stack.start()
            stack.exercise()
            stack.wait_complete(timeout_s=max(60.0, args.seconds))
            remaining = prometheus.started_at + args.seconds - time.time()
            if remaining > 0:
                time.sleep(remaining)
            window = (prometheus.started_at, time.time())
            render.render_png(
                prometheus.url, render.load_dashboard(), window, args.png, workdir=Path(scratch) / "render"
            )
        finally:
            stack.stop()
    print(f"wrote {args.png} ({args.png.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
