"""`vllm-sidecar demo` options and entry point."""

from __future__ import annotations

import argparse
import sys
from typing import Literal

from sidecar.shell.config_file import SettingsError
from sidecar.shell.tool_settings import ToolSettings, flags_for, load_tool_settings


class DemoSettings(ToolSettings):
    """The demo's options, with their defaults: flag > VLLM_SIDECAR_<OPTION> > config file > these."""

    scenario: str = "leak"  # checked against the simulator's scenarios in `run`, with the list in the error
    vllm_version: Literal["0.6", "0.10", "0.32"] = "0.32"
    interval: float = 1.0
    duration: float = 0.0
    concurrency: int | None = None
    restart_delay: float = 5.0
    keep_running: bool = False


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
    flag = flags_for(parser, DemoSettings)
    flag(
        "--scenario",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"simulator scenario to show: {', '.join(SCENARIOS)} (default leak; timings below)",
    )
    flag("--vllm-version", choices=("0.6", "0.10", "0.32"), help="metric schema to simulate")
    flag("--interval", type=float, help="the sidecar's poll interval, seconds (default %(default)g)")
    flag("--duration", type=float, help="stop after this many seconds (default: at the story's end)")
    flag("--concurrency", type=int, help="requests in flight (default: the scenario's calibrated load)")
    flag("--restart-delay", type=float, help="seconds before the demo restarts a simulator that died")
    flag(
        "--keep-running",
        action="store_true",
        help="do not stop 10 s after vLLM is back from the sidecar's first restart; run until Ctrl-C or --duration",
    )


def run(flags: argparse.Namespace) -> int:
    from sidecar.demo.load import LoadShape  # noqa: PLC0415 - keeps `vllm-sidecar --help` light
    from sidecar.demo.runner import DemoOptions, run_demo  # noqa: PLC0415
    from sidecar.sim.config import SCENARIOS  # noqa: PLC0415

    try:
        args = load_tool_settings(DemoSettings, flags)
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return 2
    if args.scenario not in SCENARIOS:  # a value from the environment or a config file is not checked by argparse
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
