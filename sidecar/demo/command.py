"""`vllm-sidecar demo` options and entry point."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Literal

from pydantic import Field

from sidecar.config.config_file import SettingsError
from sidecar.config.settings_cli import EPILOG, settings_flags
from sidecar.config.tool_settings import ToolSettings, load_tool_settings
from sidecar.sim.config import Scenario

HELP_WIDTH = 100


class DemoSettings(ToolSettings):
    """The demo's options, with their defaults: flag > VLLM_SIDECAR_<OPTION> > config file > these."""

    scenario: Scenario = Field(Scenario.LEAK, description="simulator scenario to show (timings below)")
    vllm_version: Literal["0.6", "0.10", "0.32"] = Field("0.32", description="metric schema to simulate")
    interval: float = Field(1.0, description="the sidecar's poll interval, seconds")
    duration: float = Field(0.0, description="stop after this many seconds (0: at the story's end)")
    concurrency: int | None = Field(None, description="requests in flight (unset: the scenario's calibrated load)")
    restart_delay: float = Field(5.0, description="seconds before the demo restarts a simulator that died")
    keep_running: bool = Field(
        False,
        description="do not stop once the story is over (vLLM back from the sidecar's first restart, the one "
        "without it crashed); run until Ctrl-C or --duration",
    )


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The scenarios' timelines as `story.help_epilog` lays them out; the options as every command shows them."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sidecar.demo.story import help_epilog  # noqa: PLC0415 - keeps `vllm-sidecar --help` light

    settings_flags(DemoSettings, parser)
    description = (
        "Starts the simulated vLLM and the sidecar on loopback ports, and beside them the same simulated vLLM "
        "without a sidecar, sends both the same load, and shows what the sidecar sees, decides and why, and what "
        "happens to each. The default scenario, leak, ends with the sidecar's planned, drained restart of its vLLM "
        "and the CUDA OOM crash of the other; then the demo stops. On a terminal the screen fits its size; piped "
        "or redirected, each event is one line."
    )
    # After settings_flags, which sets the epilog every command shares and a formatter that would rewrap ours.
    parser.description = textwrap.fill(description, HELP_WIDTH)
    parser.epilog = f"{help_epilog(HELP_WIDTH)}\n\n{textwrap.fill(EPILOG, HELP_WIDTH)}"
    parser.formatter_class = _Formatter


def run(flags: argparse.Namespace) -> int:
    from sidecar.demo.load import LoadShape  # noqa: PLC0415 - keeps `vllm-sidecar --help` light
    from sidecar.demo.runner import DemoOptions, run_demo  # noqa: PLC0415

    try:
        args = load_tool_settings(DemoSettings, flags)
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
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
