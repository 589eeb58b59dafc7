"""The whole test suite as two pytest runs at once: `python -m tests.suite [pytest arguments]` (`make test`).

Measured on the 2-core CI box, one serial run keeps about one core busy on average: most tests wait on real
processes (vLLM starting, a simulator in real time, systemd, Prometheus). Two runs side by side use the other.

- **Timing runs at normal priority**: the tests that time the sidecar's own reactions (daemon, policy on real
  processes, actuators, chaos, the simulator's scenarios) get the CPU they ask for, as in a serial run.
- **The rest runs at nice 10**: computations, real vLLM, the doctor, the image, Prometheus, TLS. It takes the
  CPU the timing run leaves idle, and about a tenth when both want every core. Its waits are for starts and
  answers, with bounds sized for a busy box.

Arguments are pytest's options, passed to both runs; for part of the suite run pytest itself (`pytest
tests/unit`). Each run has its own temporary folder. The second run's output is printed when it ends; the exit
status is non-zero when either run failed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NICE = 10
# Relative to the repository root; every other folder of tests/ runs at normal priority.
NICE_PATHS = (
    "tests/alerts",
    "tests/bench",
    "tests/doctor",
    "tests/e2e",
    "tests/gpu",
    "tests/loadtest",
    "tests/notify",
    "tests/policy",
    "tests/probe",
    "tests/property",
    "tests/security",
    "tests/ship",
    "tests/sim",
    "tests/unit",
)


def _pytest(paths: list[str], basetemp: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *paths, f"--basetemp={basetemp}", *extra]


def main(argv: list[str]) -> int:
    root = TESTS.parent
    missing = [path for path in NICE_PATHS if not (root / path).is_dir()]
    if missing:
        print(f"tests/suite.py names folders that do not exist: {', '.join(missing)}", file=sys.stderr)
        return 2
    paths = [arg for arg in argv if not arg.startswith("-") and (root / arg.split("::")[0]).exists()]
    if paths:
        print(f"tests.suite runs the whole suite; for {paths[0]} alone run pytest {paths[0]}", file=sys.stderr)
        return 2
    ignores = [f"--ignore={path}" for path in NICE_PATHS]
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-suite-") as scratch:
        folder = Path(scratch)
        nice_log = folder / "nice.log"
        started = time.monotonic()
        with nice_log.open("wb") as log:
            # The second run writes no cache: two runs at once would race on .pytest_cache.
            nice = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    str(NICE),
                    *_pytest(list(NICE_PATHS), folder / "nice", ["-p", "no:cacheprovider", *argv]),
                ],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                timing = subprocess.run(_pytest(["tests", *ignores], folder / "timing", argv), cwd=root, check=False)
            finally:
                nice_code = nice.wait()
        ended = time.monotonic() - started
        print(f"\n===== the run at nice {NICE} ({', '.join(NICE_PATHS)}) =====", flush=True)
        sys.stdout.write(nice_log.read_text(errors="replace"))
        print(
            f"\nsuite: {ended:.0f} s in all; normal priority exit {timing.returncode}, nice {NICE} exit {nice_code}",
            flush=True,
        )
    return 0 if timing.returncode == 0 and nice_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
