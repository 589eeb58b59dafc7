"""`vllm-sidecar run` with the repository's strict pynvml fake in place of the NVIDIA driver, scripted to report
one critical Xid event: the only way to see the Xid metrics move without a GPU that really fails.

    python -m tests.ship.fake_nvml_sidecar --xid 79 --xid-when FILE -- --vllm-url URL --gpu-source nvml ...

The Xid is reported once FILE exists, so a test decides when (e.g. after Prometheus's first scrape).

Everything but the driver is the real daemon (polling, derivation, exporter, HTTP server). The fake answers
what the real binding answers, through the same calls (see tests/fakes/fake_pynvml.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess, Scenario

GIB = 1024**3


def _emit_when_asked(nvml: FakeNvml, xid: int, trigger: Path) -> None:
    # An event is only queued on a set the daemon has registered, as with the real driver: wait for that too.
    while nvml.live_event_sets == 0 or not trigger.exists():
        time.sleep(0.1)
    nvml.emit_xid(0, xid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xid", type=int, default=79, help="the Xid code to report (79: fallen off the bus)")
    parser.add_argument("--xid-when", type=Path, required=True, help="the Xid is reported once this file exists")
    parser.add_argument("run_args", nargs="*", help="arguments of `vllm-sidecar run` (after --)")
    args = parser.parse_args(argv)
    nvml = FakeNvml(
        Scenario(
            gpus=[
                FakeGpu(
                    uuid="GPU-5e1f0000-0000-4000-8000-000000000000",
                    used_bytes=61 * GIB,
                    utilization_percent=87,
                    temperature_celsius=64,
                    # PID 1 is never vLLM, so its memory counts as another tenant's.
                    processes=[FakeProcess(pid=1, used_gpu_memory_bytes=2 * GIB)],
                )
            ]
        )
    )
    # The NVML source imports pynvml lazily, in its worker thread: whatever sys.modules holds then is the driver.
    sys.modules["pynvml"] = nvml  # type: ignore[assignment]
    threading.Thread(target=_emit_when_asked, args=(nvml, args.xid, args.xid_when), daemon=True).start()
    from sidecar.cli import main as sidecar_main  # imported after the fake is in place

    return sidecar_main(["run", *args.run_args])


if __name__ == "__main__":
    sys.exit(main())
