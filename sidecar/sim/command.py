"""`vllm-sidecar sim` options and entry point: every setting of `SimSettings` is a flag, and every `SimConfig`
field among them overrides the scenario's preset. Does I/O: the network, stderr, the exit code.

The flags are pydantic-settings' CLI for `SimSettings`; it layers them over the environment and the config file
and parses each for its type (`sidecar.sim.settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sidecar.config.settings_cli import settings_flags  # noqa: PLC0415 - keeps the CLI's start light
    from sidecar.sim.settings import SimSettings  # noqa: PLC0415

    settings_flags(SimSettings, parser, shortcuts={"sim_listen": "listen"})


def run(args: argparse.Namespace) -> int:
    from sidecar.config.address import split_listen  # noqa: PLC0415
    from sidecar.config.config_file import SettingsError  # noqa: PLC0415
    from sidecar.sim.config import scenario_config  # noqa: PLC0415
    from sidecar.sim.server import SimServer  # noqa: PLC0415
    from sidecar.sim.settings import load_sim_settings  # noqa: PLC0415

    try:
        settings = load_sim_settings(vars(args))
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return 2
    try:
        host, port = split_listen(settings.sim_listen)
        config = scenario_config(settings.scenario, **settings.overrides())
    except ValueError as error:
        print(f"vllm-sidecar: error: sim: {error}", file=sys.stderr)
        return 2

    async def serve() -> int:
        server = SimServer(config, host=host, port=port, log=sys.stderr)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        try:
            return await server.run()
        except OSError as error:
            print(
                f"vllm-sidecar: error: sim cannot listen on {settings.sim_listen}: {error.strerror or error}",
                file=sys.stderr,
            )
            return 1

    return asyncio.run(serve())
