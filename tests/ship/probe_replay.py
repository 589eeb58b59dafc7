"""A stand-in for a CUDA process with the allocator probe, for the dashboard stack (no GPU here): writes the probe
file the plugin would write, with the allocator's numbers recorded on an H200 (docs/gpu-runs.md) replayed in a
loop, so the allocator row's panels have data. The file carries this process's pid, which stays alive, so the
sidecar keeps it.

Does I/O: one file, rewritten atomically every `interval_s` by a daemon thread until `stop`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

# (allocated, reserved, inactive split) per phase of tests/gpu/fragment.py on the H200, and the counters' steps.
_PHASES = (
    (2_371_459_584, 2_413_821_952, 40_265_216),
    (1_184_617_472, 2_413_821_952, 1_038_363_648),
    (3_369_494_016, 4_290_772_992, 921_278_976),
    (3_286_666_240, 4_290_772_992, 1_004_106_752),
    (3_223_311_360, 4_248_829_952, 1_025_518_592),
    (3_258_962_944, 4_284_481_536, 1_025_518_592),
)
TOTAL_BYTES = 150_109_880_320


class ProbeReplay:
    def __init__(self, directory: Path, *, interval_s: float = 0.5, phase_s: float = 5.0) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.phase_s = phase_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-replay", daemon=True)
        self._started = time.monotonic()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        (self.directory / f"{os.getpid()}.json").unlink(missing_ok=True)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self._write()

    def _write(self) -> None:
        step = int((time.monotonic() - self._started) / self.phase_s)
        allocated, reserved, inactive_split = _PHASES[step % len(_PHASES)]
        device = {
            "index": 0,
            "uuid": "GPU-ff685be8-df5e-8f79-809b-c46e4769cbdf",
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "active_bytes": allocated,
            "inactive_split_bytes": inactive_split,
            "peak_reserved_bytes": 4_292_870_144,
            "num_alloc_retries": 2 * step,  # 2 retries and 1 OOM per round at the cap, as on the H200
            "num_ooms": step,
            "free_bytes": TOTAL_BYTES - reserved,
            "total_bytes": TOTAL_BYTES,
        }
        document = {
            "pid": os.getpid(),
            "role": "worker",
            "rank": 0,
            "time_unix_s": time.time(),
            "interval_s": self.interval_s,
            "cuda": {"available": True, "reason": None, "devices": [device]},
        }
        temporary = self.directory / f".{os.getpid()}.json.tmp"
        temporary.write_text(json.dumps(document))
        temporary.replace(self.directory / f"{os.getpid()}.json")
