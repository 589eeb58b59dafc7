"""`vllm-sidecar wait-gpu`: the wait for the old vLLM's GPU memory, through the NVML source over the strict
fake of pynvml (no GPU here) on virtual time, and the command's exits on this machine, which has no NVML.

Not proven here: a real driver releasing a killed vLLM's memory (needs a GPU; docs/gpu-runs.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.model.gpu import GpuReading
from sidecar.model.source import SourceResult
from sidecar.shell.wait_gpu import EVERY_S, wait_released
from sidecar.sources.nvml import NvmlSource
from tests.clock import VirtualClock
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess, Scenario
from tests.fakes.proc import fake_proc

GIB = 1024**3
OLD_VLLM, ENGINE, TENANT = 4242, 4243, 1717


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """The old vLLM's API server and engine core (a zombie keeps its comm), and another tenant's trainer."""
    root = tmp_path / "proc"
    entries: dict[int, tuple[str, bytes]] = {
        OLD_VLLM: ("python3\n", b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0"),
        ENGINE: ("VLLM::EngineCor\n", b""),
        TENANT: ("python3\n", b"python3\0train.py\0"),
    }
    return fake_proc(root, entries)


def gpus() -> Scenario:
    return Scenario(
        gpus=[
            FakeGpu(uuid="GPU-a", processes=[FakeProcess(ENGINE, 71 * GIB), FakeProcess(TENANT, 4 * GIB)]),
            FakeGpu(uuid="GPU-b", processes=[FakeProcess(OLD_VLLM, GIB // 2)]),
        ]
    )


class Releasing:
    """The driver releasing the engine's memory after `after_reads` reads, the API server's one read later."""

    def __init__(self, source: NvmlSource, scenario: Scenario, after_reads: int) -> None:
        self.source, self.scenario, self.after_reads, self.reads = source, scenario, after_reads, 0

    async def read(self) -> SourceResult[GpuReading]:
        self.reads += 1
        if self.reads > self.after_reads:
            self.scenario.gpus[0].processes = [p for p in self.scenario.gpus[0].processes if p.pid != ENGINE]
        if self.reads > self.after_reads + 1:
            self.scenario.gpus[1].processes = []
        return await self.source.read()


async def test_waits_until_no_vllm_process_holds_memory_and_ignores_other_tenants(proc_root: Path) -> None:
    scenario = gpus()
    clock = VirtualClock()
    source = NvmlSource(nvml=FakeNvml(scenario), proc_root=proc_root, clock=clock)
    released = Releasing(source, scenario, after_reads=6)
    code, line = await wait_released(released, timeout_s=60, clock=clock, sleep=clock.sleep)
    source.close()
    assert (code, line) == (0, "no vLLM process holds GPU memory (GPUs: 0, 1) after 3.5 s")
    assert released.reads == 8  # the tenant's 4 GiB never held the start back
    assert clock.slept == [EVERY_S] * 7


async def test_gives_up_at_the_timeout_naming_what_still_holds_memory(proc_root: Path) -> None:
    clock = VirtualClock()
    source = NvmlSource(nvml=FakeNvml(gpus()), proc_root=proc_root, clock=clock)
    code, line = await wait_released(source, timeout_s=30, clock=clock, sleep=clock.sleep)
    source.close()
    assert code == 1
    assert line == (
        "vLLM processes still hold GPU memory after 30 s: pid 4243 (VLLM::EngineCor) 71.0 GiB on GPU 0; "
        "pid 4242 (python3) 0.5 GiB on GPU 1; a vLLM started now would run out of memory (end them, or wait for "
        "the driver to release them)"
    )
    assert sum(clock.slept) == 30


async def test_only_vllms_own_gpus_are_waited_for(proc_root: Path) -> None:
    clock = VirtualClock()
    source = NvmlSource(gpu_indices=[1], nvml=FakeNvml(gpus()), proc_root=proc_root, clock=clock)
    code, line = await wait_released(source, timeout_s=0, clock=clock, sleep=clock.sleep)
    source.close()
    assert code == 1
    assert "on GPU 1" in line
    assert "on GPU 0" not in line  # the engine on GPU 0 is another vLLM's


async def test_no_nvml_is_nothing_to_wait_for(proc_root: Path) -> None:
    clock = VirtualClock()
    source = NvmlSource(nvml=FakeNvml(Scenario(library_missing=True)), proc_root=proc_root, clock=clock)
    code, line = await wait_released(source, timeout_s=30, clock=clock, sleep=clock.sleep)
    source.close()
    assert code == 0
    assert line.startswith("cannot read the GPUs (NVML not available: "), line
    assert line.endswith("): nothing to wait for")


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        # No NVML on this machine: the real command says so and lets vLLM start.
        ([], 0, "vllm-sidecar wait-gpu: cannot read the GPUs (NVML not available: "),
        (["--gpus", "0,x"], 2, "vllm-sidecar: error: --gpus 0,x: neither 'all' nor a list of GPU indices"),
        (["--timeout", "nan"], 2, "vllm-sidecar: error: --timeout nan: must be >= 0 seconds"),
        (["--vllm-process-pattern", "("], 2, "vllm-sidecar: error: --vllm-process-pattern (: "),
    ],
)
def test_the_command_exits_with_one_line(argv: list[str], code: int, said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "wait-gpu", "--timeout", "1", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (done.stdout + done.stderr).strip()
    assert (done.returncode, output.count("\n")) == (code, 0), output
    assert output.startswith(said), output
