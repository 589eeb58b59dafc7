"""The whole test suite as two pytest runs at once: `python -m tests.suite [pytest arguments]` (`make test`).

Measured on the 2-core CI box, one serial run keeps about one core busy on average: most tests wait on real
processes (vLLM starting, a simulator in real time, systemd, Prometheus). Two runs side by side use the other.

- **Timing runs at normal priority**: the tests that time the sidecar's own reactions (daemon, policy on real
  processes, actuators, chaos, the simulator's scenarios) get the CPU they ask for, as in a serial run.
- **The rest runs at nice 10**: computations, real vLLM, the doctor, the image, Prometheus, TLS. It takes the
  CPU the timing run leaves idle, and about a tenth when both want every core. Its waits are for starts and
  answers, with bounds sized for a busy box.

Two runs on two cores still contend (a niced process gets a tenth of a core, not nothing; systemd, journald and
the kernel serve both), and a bound sized for a busy box can still run out: five of the first six CI runs of
this layout failed one test each, a different one each time. So the tests that fail in either run are run
once more after both runs, alone and at normal priority, and fail the suite only if they fail again; the
summary names every such test, so one that keeps needing it is seen. CPython's own test runner does the same
(regrtest re-runs the tests that failed). More than `MAX_RERUNS` failures are not rerun: that is a broken
change, not contention; nor is a run that did not finish (interrupted, internal error, nothing collected).

Arguments are pytest's options, passed to every run; for part of the suite run pytest itself (`pytest
tests/unit`). Each run has its own temporary folder and its own pytest cache (where pytest lists its failures).
The niced run's output is printed when it ends; the exit status is non-zero when the suite failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NICE = 10
MAX_RERUNS = 5
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


def failed_tests(cache_dir: Path) -> list[str]:
    """The test ids a run recorded as failed (pytest's own `lastfailed` list); empty if none."""
    try:
        return sorted(json.loads((cache_dir / "v" / "cache" / "lastfailed").read_text()))
    except (OSError, ValueError):
        return []


def to_rerun(codes: tuple[int, int], failed: list[str]) -> list[str]:
    """The failures to run once more alone: only when both runs finished (exit 0, or 1 when tests failed; 2-5
    are an interrupted, broken or empty run), something failed, and at most `MAX_RERUNS` tests did."""
    return failed if set(codes) <= {0, 1} and 0 < len(failed) <= MAX_RERUNS else []


def passed(codes: tuple[int, int], rerun_code: int | None) -> bool:
    """The suite passed: both runs did, or they finished and what failed passed alone."""
    return codes == (0, 0) or (set(codes) <= {0, 1} and rerun_code == 0)


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
        caches = (folder / "timing-cache", folder / "nice-cache")
        nice_log = folder / "nice.log"
        started = time.monotonic()
        with nice_log.open("wb") as log:
            nice = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    str(NICE),
                    *_pytest(list(NICE_PATHS), folder / "nice", ["-o", f"cache_dir={caches[1]}", *argv]),
                ],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                timing = subprocess.run(
                    _pytest(["tests", *ignores], folder / "timing", ["-o", f"cache_dir={caches[0]}", *argv]),
                    cwd=root,
                    check=False,
                )
            finally:
                nice_code = nice.wait()
        print(f"\n===== the run at nice {NICE} ({', '.join(NICE_PATHS)}) =====", flush=True)
        sys.stdout.write(nice_log.read_text(errors="replace"))
        codes = (timing.returncode, nice_code)
        failed = [test for code, cache in zip(codes, caches, strict=True) if code == 1 for test in failed_tests(cache)]
        again = to_rerun(codes, failed)
        rerun_code: int | None = None
        if again:
            print(f"\n===== {len(again)} failed; once more, alone, at normal priority =====")
            for test in again:
                print(f"  {test}")
            sys.stdout.flush()
            rerun = subprocess.run(
                _pytest(again, folder / "rerun", ["-p", "no:cacheprovider", *argv]), cwd=root, check=False
            )
            rerun_code = rerun.returncode
        ended = time.monotonic() - started
        print(
            f"\nsuite: {ended:.0f} s in all; normal priority exit {codes[0]}, nice {NICE} exit {codes[1]}"
            + ("" if rerun_code is None else f"; the {len(again)} failed alone: exit {rerun_code}")
            + ("" if rerun_code is not None or codes == (0, 0) else f" ({len(failed)} failed: not rerun)"),
            flush=True,
        )
    return 0 if passed(codes, rerun_code) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
