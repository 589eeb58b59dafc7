"""The test suite in two stages: `python -m tests.suite fast`, then `python -m tests.suite` (`make fast`, `make test`).

**The fast stage** (`FAST_PATHS`: the pure code's unit and property tests) needs nothing but the dev environment
and runs first, in CI before any Debian package, vLLM or rootfs is installed: a broken change fails in minutes.

**The slow stage** is every other folder, as four pytest runs at once (`lanes`). Measured on the 2-core CI box,
one serial run keeps about one core busy: most tests wait on real processes (vLLM starting, a simulator in real
time, systemd, Prometheus). Runs side by side use the rest.

- **Timing runs at normal priority**, in two lanes: the tests that time the sidecar's reactions on a real vLLM
  (`REAL_VLLM_TIMING`, waiting on vLLM's CPU work), and the other timing tests (daemon, actuators, chaos, the
  simulator's scenarios, waiting on timers). They get the CPU they ask for, as in a serial run.
- **The rest runs at nice 10**, in two lanes: computations, real vLLM, the doctor, the image, Prometheus, TLS.
  They take the CPU the timing runs leave idle, and about a tenth when they want every core.

**A test that needs a rerun to pass is a red test.** What fails in any run is run once more, alone at normal
priority, to tell flaky from broken, and the summary says which. The suite passes only if nothing failed, or
every failure passed alone *and* is listed in `QUARANTINE` (tests/quarantine.toml) with its cause; a listed
test that fails alone too is broken and fails the suite. The quarantine is printed at the end of every run,
so nothing hides there unseen. More than `MAX_RERUNS` failures are not rerun (a broken change), nor is a run
that did not finish (interrupted, internal error, nothing collected).

Other arguments are pytest's options, passed to every run; for part of the suite run pytest itself (`pytest
tests/unit`). Each run has its own temporary folder and its own pytest cache (where pytest lists its failures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.ports import LANE_ENV

TESTS = Path(__file__).resolve().parent
QUARANTINE = TESTS / "quarantine.toml"
NICE = 10
MAX_RERUNS = 5
# Relative to the repository root. The fast stage: pure code, no real component, no wall-clock wait.
FAST_PATHS = ("tests/unit", "tests/policy", "tests/property")
# The tests that time the sidecar's reactions on a real vLLM: a run of their own at normal priority, beside the
# other timing tests (they spend their time waiting on vLLM's CPU work, the others on timers).
REAL_VLLM_TIMING = (
    "tests/chaos/test_back_fast_real_vllm.py",
    "tests/chaos/test_real_vllm_chaos.py",
    "tests/actuators/test_real_vllm_hang_e2e.py",
    "tests/actuators/test_real_vllm_remediation_e2e.py",
)
# The slow stage's runs at nice 10, two of them: every other folder of tests/ (less FAST_PATHS) runs at normal
# priority. Two, so that when the timing runs end the niced rest uses both cores (CI run 16: one niced run went
# on alone at 20-37 % of the CPU for its last two minutes); split so the two take about as long.
NICE_PATHS_A = ("tests/doctor", "tests/e2e", "tests/alerts", "tests/sim")
NICE_PATHS_B = (
    "tests/ship",
    "tests/bench",
    "tests/gpu",
    "tests/loadtest",
    "tests/notify",
    "tests/probe",
    "tests/security",
)
NICE_PATHS = (*NICE_PATHS_A, *NICE_PATHS_B)


class QuarantineError(ValueError):
    """tests/quarantine.toml cannot be read; the message says where."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    test: str  # a pytest node id, as the summary prints it
    cause: str  # why it fails now and then: what races what
    since: str  # the date it was listed


def read_quarantine(text: str) -> tuple[Quarantined, ...]:
    """The listed tests; every entry needs its `test`, its `cause` and the date `since`."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise QuarantineError(f"{QUARANTINE.name}: {error}") from None
    entries = document.get("test", [])
    if not isinstance(entries, list):
        raise QuarantineError(f"{QUARANTINE.name}: `test` must be an array of tables ([[test]])")
    listed: list[Quarantined] = []
    for index, entry in enumerate(entries):
        fields = {name: entry.get(name) if isinstance(entry, dict) else None for name in ("test", "cause", "since")}
        empty = [name for name, value in fields.items() if not isinstance(value, str) or not value.strip()]
        if empty:
            raise QuarantineError(f"{QUARANTINE.name}: test #{index + 1} has no {', '.join(empty)}")
        listed.append(Quarantined(test=str(fields["test"]), cause=str(fields["cause"]), since=str(fields["since"])))
    return tuple(listed)


def _pytest(paths: list[str], basetemp: Path, extra: list[str]) -> list[str]:
    # Python's own tracebacks: pytest's long ones re-parse each source file with ast.parse, and CPython 3.11.7
    # (CI's) can leave the AST constructor's depth count unbalanced (gh-106905, seen in threaded programs; fixed
    # in 3.11.8): in CI run 8 reporting a failure raised "AST constructor recursion depth mismatch" and ended the
    # whole lane with an INTERNALERROR, the failure unreported and never rerun. The assertion's own message is
    # unchanged. `--tb` given on the command line still wins (the last one counts).
    return [sys.executable, "-m", "pytest", *paths, f"--basetemp={basetemp}", "--tb=native", *extra]


def failed_tests(cache_dir: Path) -> list[str]:
    """The test ids a run recorded as failed (pytest's own `lastfailed` list); empty if none."""
    try:
        return sorted(json.loads((cache_dir / "v" / "cache" / "lastfailed").read_text()))
    except (OSError, ValueError):
        return []


def to_rerun(codes: tuple[int, ...], failed: list[str]) -> list[str]:
    """The failures to run once more alone: only when every run finished (exit 0, or 1 when tests failed; 2-5
    are an interrupted, broken or empty run), something failed, and at most `MAX_RERUNS` tests did."""
    return failed if set(codes) <= {0, 1} and 0 < len(failed) <= MAX_RERUNS else []


def verdict(
    codes: tuple[int, ...], failed: list[str], rerun_code: int | None, quarantine: tuple[Quarantined, ...]
) -> tuple[bool, list[str]]:
    """Whether the suite passed, and one line per failure saying what it was.

    Passed: every run did; or they finished, what failed passed alone, and every such test is quarantined."""
    if set(codes) == {0}:
        return True, []
    if not set(codes) <= {0, 1} or rerun_code is None:
        return False, [f"FAILED {test}" for test in failed]
    listed = {entry.test for entry in quarantine}
    if rerun_code != 0:
        return False, [f"FAILED {test} (failed again alone: broken, not flaky)" for test in failed]
    unlisted = "fix it, or list it with its cause in tests/quarantine.toml"
    lines = [f"FLAKY {test} (passed only alone: {'quarantined' if test in listed else unlisted})" for test in failed]
    return all(test in listed for test in failed), lines


def _print_quarantine(quarantine: tuple[Quarantined, ...]) -> None:
    print(f"\nquarantine ({QUARANTINE.relative_to(TESTS.parent)}): {len(quarantine)} test(s)")
    for entry in quarantine:
        print(f"  {entry.test} (since {entry.since}): {entry.cause}")


def fast(argv: list[str]) -> int:
    """The fast stage: one pytest run over `FAST_PATHS`, on every core (pytest-xdist): pure tests, nothing shared
    between them but the source (one process on CI's 2 cores took 75 s, two take about 42)."""
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-fast-") as scratch:
        run = _pytest(list(FAST_PATHS), Path(scratch) / "fast", ["-p", "no:cacheprovider", "-n", "auto", *argv])
        return subprocess.run(run, cwd=TESTS.parent, check=False).returncode


@dataclass(frozen=True, slots=True)
class Lane:
    name: str
    paths: tuple[str, ...]  # what it runs; "tests" with `ignores` for the rest of the folder
    ignores: tuple[str, ...] = ()
    nice: int = 0


def lanes() -> tuple[Lane, ...]:
    """The slow stage's runs: the real-vLLM timing tests, the other timing tests, and the niced rest in two."""
    return (
        Lane("timing", ("tests",), ignores=(*NICE_PATHS, *FAST_PATHS, *REAL_VLLM_TIMING)),
        Lane("real vLLM timing", REAL_VLLM_TIMING),
        Lane(f"nice {NICE} (a)", NICE_PATHS_A, nice=NICE),
        Lane(f"nice {NICE} (b)", NICE_PATHS_B, nice=NICE),
    )


def slow(argv: list[str], quarantine: tuple[Quarantined, ...]) -> int:
    """The slow stage: its lanes at once (the first one's output live, the others' after), then what failed
    alone."""
    root = TESTS.parent
    runs = lanes()
    with tempfile.TemporaryDirectory(prefix="vllm-sidecar-suite-") as scratch:
        folder = Path(scratch)
        caches = [folder / f"cache-{index}" for index in range(len(runs))]
        logs = [folder / f"lane-{index}.log" for index in range(len(runs))]
        started = time.monotonic()
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for index, lane in enumerate(runs):
                extra = [f"--ignore={path}" for path in lane.ignores]
                command = _pytest(
                    list(lane.paths), folder / f"lane-{index}", [*extra, "-o", f"cache_dir={caches[index]}", *argv]
                )
                if lane.nice:
                    command = ["nice", "-n", str(lane.nice), *command]
                output = None if index == 0 else logs[index].open("wb")
                # its own slice of loopback ports (tests/ports.py); 0 is the fast stage's and the rerun's
                env = {**os.environ, LANE_ENV: str(index + 1)}
                processes.append(
                    subprocess.Popen(
                        command, cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT if output else None
                    )
                )
                if output is not None:
                    output.close()  # the child holds its own copy
            spent = _wait_for_lanes(processes, started)
            codes = tuple(process.returncode for process in processes)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
        for index, lane in enumerate(runs[1:], start=1):
            print(f"\n===== the {lane.name} run ({', '.join(lane.paths)}) =====", flush=True)
            sys.stdout.write(logs[index].read_text(errors="replace"))
        failed = [test for code, cache in zip(codes, caches, strict=True) if code == 1 for test in failed_tests(cache)]
        again = to_rerun(codes, failed)
        rerun_code: int | None = None
        if again:
            print(f"\n===== {len(again)} failed; once more, alone, at normal priority (flaky or broken?) =====")
            sys.stdout.flush()
            rerun = subprocess.run(
                _pytest(again, folder / "rerun", ["-p", "no:cacheprovider", *argv]), cwd=root, check=False
            )
            rerun_code = rerun.returncode
        ok, lines = verdict(codes, failed, rerun_code, quarantine)
        ended = time.monotonic() - started
        exits = ", ".join(f"{lane.name} exit {code}" for lane, code in zip(runs, codes, strict=True))
        print(f"\nsuite: {ended:.0f} s in all; {exits}", flush=True)
        print(
            "  lanes (ended after, CPU of the lane and the processes it waited for): "
            + "; ".join(
                f"{lane.name} {wall:.0f} s, {cpu:.0f} CPU-s" for lane, (wall, cpu) in zip(runs, spent, strict=True)
            )
        )
        for line in lines:
            print(f"  {line}")
    return 0 if ok else 1


def _wait_for_lanes(processes: list[subprocess.Popen[bytes]], started: float) -> list[tuple[float, float]]:
    """Wait for every lane; per lane, when it ended (s after `started`) and the CPU seconds it and the processes
    it waited for used (os.wait4's rusage): where the stage's two cores went."""
    spent = [(0.0, 0.0)] * len(processes)
    by_pid = {process.pid: index for index, process in enumerate(processes)}
    while by_pid:
        pid, status, usage = os.wait4(-1, 0)
        index = by_pid.pop(pid, None)
        if index is None:
            continue  # not a lane (none is started here; kept safe)
        processes[index].returncode = os.waitstatus_to_exitcode(status)
        spent[index] = (time.monotonic() - started, usage.ru_utime + usage.ru_stime)
    return spent


def main(argv: list[str]) -> int:
    root = TESTS.parent
    missing = [path for path in (*NICE_PATHS, *FAST_PATHS, *REAL_VLLM_TIMING) if not (root / path).exists()]
    if missing:
        print(f"tests/suite.py names folders that do not exist: {', '.join(missing)}", file=sys.stderr)
        return 2
    stage_fast = argv[:1] == ["fast"]
    argv = argv[1:] if stage_fast else argv
    paths = [arg for arg in argv if not arg.startswith("-") and (root / arg.split("::")[0]).exists()]
    if paths:
        print(f"tests.suite runs a whole stage; for {paths[0]} alone run pytest {paths[0]}", file=sys.stderr)
        return 2
    try:
        quarantine = read_quarantine(QUARANTINE.read_text())
    except (OSError, QuarantineError) as error:
        print(f"tests.suite: {error}", file=sys.stderr)
        return 2
    code = fast(argv) if stage_fast else slow(argv, quarantine)
    _print_quarantine(quarantine)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
