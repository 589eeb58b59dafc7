"""`vllm-sidecar run` with the repository's strict pynvml fake in place of the NVIDIA driver, whose faults a test
switches at run time by writing one word into a control file:

    python -m tests.chaos.nvml_chaos_sidecar --control FILE run --vllm-url URL --gpu-source nvml ...

The word is read on every NVML call: `` (none), `refuse` (memory info answers NVML_ERROR_TIMEOUT), `raise`
(the binding raises something that is no NVMLError at all), `hang` (every call blocks until the word
changes: a wedged driver), `lost` (the GPU answers GpuIsLost, as after Xid 79). Everything but the driver is
the real daemon.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pynvml

from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess, Scenario

GIB = 1024**3
TOTAL_BYTES = 80 * GIB
USED_BYTES = 61 * GIB
UTILIZATION_PERCENT = 87
TEMPERATURE_CELSIUS = 64


class ChaosNvml(FakeNvml):
    def __init__(self, scenario: Scenario, control: Path) -> None:
        super().__init__(scenario)
        self._control = control

    def fault(self) -> str:
        try:
            return self._control.read_text().strip()
        except OSError:
            return ""

    def _enter(self) -> None:
        while self.fault() == "hang":
            time.sleep(0.05)  # blocked in the "driver" until the test lets go
        fault = self.fault()
        if fault == "raise":
            raise RuntimeError("the NVML binding failed in an unexpected way")
        for gpu in self.scenario.gpus:
            gpu.lost = fault == "lost"
            gpu.refusals = {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_TIMEOUT} if fault == "refuse" else {}
        super()._enter()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control", type=Path, required=True)
    args, rest = parser.parse_known_args(argv)
    nvml = ChaosNvml(
        Scenario(
            gpus=[
                FakeGpu(
                    uuid="GPU-c4a05000-0000-4000-8000-000000000000",
                    total_bytes=TOTAL_BYTES,
                    used_bytes=USED_BYTES,
                    utilization_percent=UTILIZATION_PERCENT,
                    temperature_celsius=TEMPERATURE_CELSIUS,
                    processes=[FakeProcess(pid=1, used_gpu_memory_bytes=2 * GIB)],  # PID 1: another tenant
                )
            ]
        ),
        args.control,
    )
    # The NVML source imports pynvml lazily, in its worker thread: whatever sys.modules holds then is the driver.
    sys.modules["pynvml"] = nvml  # type: ignore[assignment]
    from sidecar.cli import main as sidecar_main  # imported after the fake is in place

    return sidecar_main(rest)


if __name__ == "__main__":
    sys.exit(main())
