"""Reaction time: from the simulated GPU crossing the pause threshold to the daemon's /readyz answering 503.

Does I/O: per trial, a fresh `vllm-sidecar sim --scenario tenant` and a fresh daemon reading its GPU
(`--gpu-source sim`), and two watcher threads. The tenant (another process on the GPU) starts a few seconds
in and grows at a known rate, so free memory falls through the policy's 5 % line at a moment the GPU
watcher pins down: it polls /sim/gpu every few milliseconds and places the crossing on the known growth
line between its last two readings. The readiness watcher polls /readyz as often; the reaction ends with
the first 503 it receives (an upper bound, by at most one poll). The tenant's start is jittered over one
interval, so the crossing falls at a random point of the daemon's poll cycle, as it would in production.

The daemon counts the tenant as vLLM's own (`--vllm-process-pattern` also matches its name): memory another
process holds while vLLM stays inside its budget is pressure, not a pause (a pause cannot free it), and what
is timed here is the path from a crossing that pauses to the 503, which is the same whoever holds the memory.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.process import Child, free_port, http_status, wait_for

GIB = 2**30
TENANT_BYTES_PER_S = 4 * GIB
MIN_GPU_FREE_RATIO = 0.05  # the policy's default pause threshold (--min-gpu-free)
POLL_S = 0.005
SLACK_S = 0.1  # the target: within one interval plus this
VLLM_AND_TENANT = r"vllm|VLLM::|train\.py"  # the default pattern and the simulator's tenant ("python train.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reaction:
    interval_s: float
    reactions_s: tuple[float, ...]
    failed_trials: int

    @property
    def target_s(self) -> float:
        return self.interval_s + SLACK_S

    def percentile_s(self, share: float) -> float:
        ordered = sorted(self.reactions_s)
        if not ordered:
            return float("nan")
        if len(ordered) == 1:
            return ordered[0]
        return statistics.quantiles(ordered, n=100, method="inclusive")[min(98, max(0, round(share * 100) - 1))]

    @property
    def met(self) -> bool:
        return bool(self.reactions_s) and self.failed_trials == 0 and max(self.reactions_s) <= self.target_s


class _GpuWatch(threading.Thread):
    """Finds when GPU 0's free memory went under the threshold."""

    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._halt = stop
        self.crossed_s: float | None = None

    def run(self) -> None:
        previous_s: float | None = None
        with httpx.Client(timeout=1.0) as client:
            while not self._halt.is_set() and self.crossed_s is None:
                try:
                    gpu = json.loads(client.get(self._url).content)["gpus"][0]
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    time.sleep(POLL_S)
                    continue
                seen_s = time.monotonic()
                deficit = MIN_GPU_FREE_RATIO * gpu["total_bytes"] - (gpu["total_bytes"] - gpu["used_bytes"])
                if deficit > 0:
                    # The tenant grows linearly: it crossed deficit / rate before this reading.
                    crossed = seen_s - deficit / TENANT_BYTES_PER_S
                    self.crossed_s = max(crossed, previous_s) if previous_s is not None else crossed
                previous_s = seen_s
                time.sleep(POLL_S)


class _ReadyWatch(threading.Thread):
    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._halt = stop
        self.paused_s: float | None = None

    def run(self) -> None:
        while not self._halt.is_set() and self.paused_s is None:
            if http_status(self._url, timeout_s=1.0) == httpx.codes.SERVICE_UNAVAILABLE:
                self.paused_s = time.monotonic()
            time.sleep(POLL_S)


def _trial(interval_s: float, rng: random.Random, workdir: Path) -> float:
    sim_port, daemon_port = free_port(), free_port()
    sim_url, daemon_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{daemon_port}"
    tenant_start_s = 4.0 + rng.uniform(0.0, interval_s)
    sim = Child(
        [
            *("sim", "--listen", f"127.0.0.1:{sim_port}", "--scenario", "tenant"),
            *("--tenant-start-s", str(tenant_start_s), "--tenant-bytes-per-s", str(TENANT_BYTES_PER_S)),
        ],
        workdir / "sim.log",
    )
    daemon = Child(
        [
            *("run", "--vllm-url", sim_url, "--gpu-source", "sim", "--listen", f"127.0.0.1:{daemon_port}"),
            *("--interval", str(interval_s), "--log-level", "warning", "--state-dir", str(workdir / "state")),
            *("--vllm-process-pattern", VLLM_AND_TENANT),
        ],
        workdir / "daemon.log",
    )
    stop = threading.Event()
    try:
        wait_for(lambda: http_status(daemon_url + "/readyz") == httpx.codes.OK, 20, "the daemon to admit traffic")
        gpu, ready = _GpuWatch(sim_url + "/sim/gpu", stop), _ReadyWatch(daemon_url + "/readyz", stop)
        gpu.start()
        ready.start()
        wait_for(lambda: gpu.crossed_s is not None and ready.paused_s is not None, 30, "the pause", poll_s=0.05)
        crossed_s, paused_s = gpu.crossed_s, ready.paused_s
        if crossed_s is None or paused_s is None:
            raise TimeoutError("the watchers stopped before the pause")
        return paused_s - crossed_s
    finally:
        stop.set()
        daemon.stop()
        sim.stop()


def measure_reaction(interval_s: float, *, trials: int, seed: int = 0) -> Reaction:
    rng = random.Random(seed)
    reactions: list[float] = []
    failed = 0
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-reaction-") as tmp:
        for index in range(trials):
            workdir = Path(tmp) / f"trial-{index}"
            workdir.mkdir()
            try:
                reactions.append(_trial(interval_s, rng, workdir))
            except TimeoutError as error:
                failed += 1
                print(f"  reaction trial {index} failed: {error}")
    return Reaction(interval_s=interval_s, reactions_s=tuple(reactions), failed_trials=failed)
