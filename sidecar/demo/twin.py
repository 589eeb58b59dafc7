"""The same vLLM without a sidecar: a second simulator with the same scenario and seed, under the same load, that
nobody pauses or restarts before it fails. Does I/O (a process, network load).

The demo stands in for systemd for it too (`Restart=on-failure` after --restart-delay), so both vLLMs have the
same supervision and differ only in the sidecar. What happens to it is the measure of what the sidecar prevents.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from sidecar.demo.load import LoadCounters, LoadShape, drive
from sidecar.demo.outcome import Side
from sidecar.demo.supervisor import SimSupervisor

NAME = "vLLM without the sidecar"


def sim_argv(python: str, port: int, scenario: str, vllm_version: str) -> list[str]:
    """The simulator's command line; both vLLMs use it, with the preset's seed."""
    argv = [python, "-m", "sidecar", "sim", "--listen", f"127.0.0.1:{port}"]
    return [*argv, "--scenario", scenario, "--vllm-version", vllm_version]


async def wait_healthy(url: str, supervisor: SimSupervisor, timeout_s: float) -> bool:
    """Whether the simulator at `url` answered /health 200 within `timeout_s` (False at once if it exited)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            process = supervisor.process
            if process is not None and process.exit_code() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url + "/health")).status_code == httpx.codes.OK:
                    return True
            await asyncio.sleep(0.2)
    return False


def side(supervisor: SimSupervisor, counters: LoadCounters, started_s: float, now_s: float) -> Side:
    """One vLLM's story so far, its times counted from the demo's start (`started_s`, monotonic)."""
    crash = supervisor.first_crash
    restarted = supervisor.first_restart_s
    return Side(
        state=supervisor.state(now_s),
        crashed_at_s=None if crash is None else crash[0] - started_s,
        crash_cause="" if crash is None else crash[1],
        crashes=supervisor.crashes,
        restarted_at_s=None if restarted is None else restarted - started_s,
        succeeded=counters.succeeded,
        failed=counters.failed,
        refused=counters.refused,
        interrupted=counters.interrupted,
        in_flight=counters.in_flight,
        oldest_in_flight_s=counters.oldest_in_flight_s(now_s),
    )


class Twin:
    def __init__(
        self, argv: list[str], url: str, workdir: Path, *, restart_delay_s: float, event: Callable[[str], None]
    ) -> None:
        self.url = url
        self.sim = SimSupervisor(
            argv, workdir, restart_delay_s=restart_delay_s, event=event, name=NAME, log_prefix="sim-without"
        )
        self.counters = LoadCounters()
        self._load: asyncio.Task[None] | None = None

    def start_load(self, shape: LoadShape, stop: asyncio.Event) -> None:
        """The same load as the sidecar's vLLM gets, sent whatever happens: there is no /readyz to ask."""
        self._load = asyncio.create_task(
            drive(
                vllm_url=self.url,
                readiness_url=None,
                model="sim-llama",
                shape=shape,
                counters=self.counters,
                stop=stop,
            )
        )

    async def stop_load(self) -> None:
        if self._load is not None:
            await self._load

    def side(self, started_s: float, now_s: float) -> Side:
        return side(self.sim, self.counters, started_s, now_s)
