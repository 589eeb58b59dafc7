"""`vllm-sidecar demo` options and entry point."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        default="leak",
        help="simulator scenario to show (default leak: memory grows until vLLM dies, within about a minute)",
    )
    parser.add_argument(
        "--vllm-version", default="0.32", choices=("0.6", "0.10", "0.32"), help="metric schema to simulate"
    )
    parser.add_argument("--interval", type=float, default=1.0, help="the sidecar's poll interval, seconds (default 1)")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (default: Ctrl-C)")
    parser.add_argument("--concurrency", type=int, default=24, help="concurrent requests of the demo's load")
    parser.add_argument(
        "--restart-delay", type=float, default=5.0, help="seconds before the demo restarts a dead simulator"
    )


def run(args: argparse.Namespace) -> int:
    from sidecar.demo.load import LoadShape  # noqa: PLC0415 - keeps `vllm-sidecar --help` light
    from sidecar.demo.runner import DemoOptions, run_demo  # noqa: PLC0415

    if args.interval <= 0 or args.duration < 0 or args.concurrency < 1 or args.restart_delay < 0:
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
            shape=LoadShape(concurrency=args.concurrency),
        )
    )
