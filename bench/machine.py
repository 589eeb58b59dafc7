"""The machine a benchmark ran on, in one line for the results. Reads /proc; writes nothing.

Every figure in the results depends on it, and on what else was running: the load average at the start and
at the end says how busy a shared machine was while the numbers were taken.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    cpu_model: str
    cores: int
    architecture: str
    kernel: str
    python: str
    memory_gib: float
    load_average: tuple[float, float, float]

    def line(self) -> str:
        one, five, fifteen = self.load_average
        return (
            f"{self.cores} cores {self.architecture} ({self.cpu_model}), {self.memory_gib:.0f} GiB, "
            f"Linux {self.kernel}, Python {self.python}; load average {one:.2f} {five:.2f} {fifteen:.2f}"
        )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def describe_machine() -> Machine:
    return Machine(
        cpu_model=_cpu_model(),
        cores=os.cpu_count() or 1,
        architecture=platform.machine(),
        kernel=platform.release(),
        python=platform.python_version(),
        memory_gib=_memory_gib(),
        load_average=load_average(),
    )
