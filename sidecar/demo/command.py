"""`vllm-sidecar demo` options and entry point."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sidecar.demo.story import help_epilog  # noqa: PLC0415 - keeps `vllm-sidecar --help` light
    from sidecar.sim.config import SCENARIOS  # noqa: PLC0415

    parser.description = (
        "Starts the simulated vLLM and the sidecar on loopback ports, sends load, and shows what the sidecar sees, "
        "decides and why. The default scenario, leak, ends with the sidecar's planned, drained restart of vLLM "
        "before the leak would have crashed it; then the demo stops."
    )
    parser.epilog = help_epilog()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--scenario",
        default="leak",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"simulator scenario to show: {', '.join(SCENARIOS)} (default leak; timings below)",
    )
    parser.add_argument(
        "--vllm-version", default="0.32", choices=("0.6", "0.10", "0.32"), help="metric schema to simulate"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="the sidecar's poll interval, seconds (default 1)")
    parser.add_argument(
        "--duration", type=float, default=0.0, help="stop after this many seconds (default: at the story's end)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="requests in flight (default: the scenario's calibrated load)"
    )
    parser.add_argument(
        "--restart-delay", type=float, default=5.0, help="seconds before the demo restarts a simulator that died"
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="do not stop 10 s after vLLM is back from the sidecar's first restart; run until Ctrl-C or --duration",
    )


def run(args: argparse.Namespace) -> int:
    from sidecar.demo.load import LoadShape  # noqa: PLC0415 - keeps `vllm-sidecar --help` light
    from sidecar.demo.runner import DemoOptions, run_demo  # noqa: PLC0415
    from sidecar.sim.config import SCENARIOS  # noqa: PLC0415

    if args.scenario not in SCENARIOS:  # a value from a config file is not checked by argparse
        print(
            f"vllm-sidecar: error: demo: unknown scenario {args.scenario!r}; choose one of {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    concurrency = args.concurrency
    bad_concurrency = concurrency is not None and concurrency < 1
    if args.interval <= 0 or args.duration < 0 or bad_concurrency or args.restart_delay < 0:
        print(
            "vllm-sidecar: error: demo: --interval and --concurrency must be positive, durations >= 0", file=sys.stderr
        )
        return 2
    return run_demo(
        DemoOptions(
            scenario=args.scenario,
            vllm_version=args.vllm_version,
            interval_s=args.interval,
            duration_s=args.duration,
            restart_delay_s=args.restart_delay,
            keep_running=bool(args.keep_running),
            shape=LoadShape.for_scenario(args.scenario, concurrency),
        )
    )
