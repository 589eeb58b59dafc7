"""The whole test suite as two pytest runs at once: `python -m tests.suite [pytest arguments]` (`make test`).

Measured on the 2-core CI box, one serial run keeps about one core busy on average: most tests wait on real
processes (vLLM starting, a simulator in real time, systemd, Prometheus). Two runs side by side use the other.

- **Timing runs at normal priority**: the tests that time the sidecar's own reactions (daemon, policy on real
  processes, actuators, chaos, the simulator's scenarios) get the CPU they ask for, as in a serial run. A
  failure here fails the suite.
- **The rest runs at nice 10**: computations, real vLLM, the doctor, the image, Prometheus, TLS. It takes the
  CPU the timing run leaves idle, and about a tenth when both want every core. Its waits are for starts and
  answers, with bounds sized for a busy box; starved for long enough, one can still run out. So the tests that
  fail in this run are run once more after both runs, alone and at normal priority, and fail the suite only if
  they fail again. The summary names every such test, so a test that keeps needing it is seen. More than
  `MAX_RERUNS` failures are not rerun: that is a broken change, not a starved run.

Arguments are pytest's options, passed to every run; for part of the suite run pytest itself (`pytest
tests/unit`). Each run has its own temporary folder, and the niced run its own pytest cache (the list of its
failures). The other runs' output is printed when they end; the exit status is non-zero when the suite failed.
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
    """The test ids the niced run recorded as failed (pytest's own `lastfailed` list); empty if none."""
    try:
        return sorted(json.loads((cache_dir / "v" / "cache" / "lastfailed").read_text()))
    except (OSError, ValueError):
        return []


def to_rerun(nice_code: int, failed: list[str]) -> list[str]:
    """The niced run's failures to run once more alone: only when tests failed (exit 1; 2-5 are an interrupted,
    broken or empty run) and there are at most `MAX_RERUNS` of them."""
    return failed if nice_code == 1 and 0 < len(failed) <= MAX_RERUNS else []


def passed(timing_code: int, nice_code: int, rerun_code: int | None) -> bool:
    """The suite passed: the normal-priority run did, and the niced run did or its failures passed alone."""
    return timing_code == 0 and (nice_code == 0 or (nice_code == 1 and rerun_code == 0))


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
        nice_cache = folder / "nice-cache"
        nice_log = folder / "nice.log"
        started = time.monotonic()
        with nice_log.open("wb") as log:
            nice = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    str(NICE),
                    *_pytest(list(NICE_PATHS), folder / "nice", ["-o", f"cache_dir={nice_cache}", *argv]),
                ],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                timing = subprocess.run(_pytest(["tests", *ignores], folder / "timing", argv), cwd=root, check=False)
            finally:
                nice_code = nice.wait()
        print(f"\n===== the run at nice {NICE} ({', '.join(NICE_PATHS)}) =====", flush=True)
        sys.stdout.write(nice_log.read_text(errors="replace"))
        failed = failed_tests(nice_cache)
        rerun_code: int | None = None
        if to_rerun(nice_code, failed):
            print(f"\n===== {len(failed)} failed at nice {NICE}; once more, alone, at normal priority =====")
            for test in failed:
                print(f"  {test}")
            sys.stdout.flush()
            rerun = subprocess.run(
                _pytest(
                    list(NICE_PATHS),
                    folder / "rerun",
                    ["-o", f"cache_dir={nice_cache}", "--last-failed", "--last-failed-no-failures=none", *argv],
                ),
                cwd=root,
                check=False,
            )
            rerun_code = rerun.returncode
        ended = time.monotonic() - started
        print(
            f"\nsuite: {ended:.0f} s in all; normal priority exit {timing.returncode}, nice {NICE} exit {nice_code}"
            + ("" if rerun_code is None else f", its {len(failed)} failed test(s) alone: exit {rerun_code}")
            + ("" if nice_code != 1 or rerun_code is not None else f" ({len(failed)} failed: not rerun)"),
            flush=True,
        )
    return 0 if passed(timing.returncode, nice_code, rerun_code) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
