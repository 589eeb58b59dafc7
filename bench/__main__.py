"""`python -m bench [SUITE ...]`: what the sidecar costs and what it is worth, against references from the same run.

Suites (all by default, in this order):
  parser    our parser against prometheus_client.parser on the same bytes (50 KB, 300 KB, 1 MB), values compared
  tick      the real daemon polling vLLM stand-ins: CPU per tick, share of a core, peak RSS, at 1, 2 and 5 s
  growth    one tick's pure work as the exposition grows (engines) and as GPUs are added
  reaction  simulated GPU crossing the pause threshold -> /readyz 503, over repeated trials
  efficacy  burst, leak, tenant and hang under a fixed load with the sidecar off and on, one replica
  fleet     the same behind a router that honours readiness, two replicas, one failing (the goodput targets)
  probe     one sample of the allocator probe plugin (and its file write) against torch.cuda.memory_stats()
  probe-vllm  real vLLM on CPU with and without the plugin: throughput under the same load
  recovery  real vLLM on CPU, the sidecar on defaults (exec): time to serving after a kill and a hang, and
            restarts over a loaded-but-alive run (queue, long prefills, SIGSTOP pauses of 10-40 s)

Each suite prints as it goes; the results, with the machine, go to bench/RESULTS.md (see --results).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.machine import describe_machine, load_average
from bench.options import Options
from bench.report import Results
from bench.suites import SUITES

DEFAULT_RESULTS = Path(__file__).with_name("RESULTS.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("suites", nargs="*", choices=[*SUITES, []], metavar="SUITE", help=", ".join(SUITES))
    parser.add_argument("--repeats", type=int, default=15, help="in-process timings: rounds per median")
    parser.add_argument("--tick-seconds", type=float, default=20.0, help="daemon suite: least steady-state seconds")
    parser.add_argument("--tick-serial", action="store_true", help="daemon suite: one daemon at a time")
    parser.add_argument("--reaction-trials", type=int, default=8)
    parser.add_argument("--reaction-intervals", default="1", help="comma-separated poll intervals, seconds")
    parser.add_argument("--scenarios", default="burst,leak,tenant,hang", help="efficacy: which, comma-separated")
    parser.add_argument("--efficacy-scale", type=float, default=1.0, help="efficacy: multiply each run's length")
    parser.add_argument("--recovery-trials", type=int, default=3, help="recovery: kills and hangs, each")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="markdown file to write")
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args(argv)
    chosen = args.suites or list(SUITES)
    options = Options(
        repeats=args.repeats,
        tick_seconds=args.tick_seconds,
        tick_serial=args.tick_serial,
        reaction_trials=args.reaction_trials,
        reaction_intervals=tuple(float(part) for part in args.reaction_intervals.split(",")),
        scenarios=tuple(part for part in args.scenarios.split(",") if part),
        efficacy_scale=args.efficacy_scale,
        recovery_trials=args.recovery_trials,
    )
    machine = describe_machine()
    results = Results(machine=machine)
    print(f"machine: {machine.line()}")
    started = time.monotonic()
    for name in SUITES:
        if name in chosen:
            print(f"\n== {name} ==")
            SUITES[name](options, results)
    results.finish(elapsed_s=time.monotonic() - started, load_at_end=load_average())
    print(f"\n{results.targets_text()}")
    if not args.no_results:
        args.results.write_text(results.markdown())
        print(f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
