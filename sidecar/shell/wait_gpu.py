"""`vllm-sidecar wait-gpu`: before vLLM starts, wait until no vLLM process holds GPU memory any more.

A restart is only clean when the old vLLM is wholly gone: an engine core can outlive its API server, and a
process the kernel has not finished reaping (a SIGKILLed process in uninterruptible sleep, a zombie) keeps its
GPU memory. A new vLLM started beside it profiles the card with that memory taken and runs out at once, or
sizes its KV cache from what is left. Run as vLLM's `ExecStartPre=` (deploy/systemd/vllm.service.example) or
at the top of an exec restart script, it makes every start wait, whoever starts vLLM: the sidecar's restart,
systemd's `Restart=`, a person. Exit 0 when the GPUs are free of vLLM (or there is no GPU to read: nothing to
wait for, never a reason to keep vLLM down), 1 after `--timeout` with one line naming what still holds memory:
then the start fails and says why, instead of a vLLM that would OOM.

Processes are vLLM's when their command line matches `--vllm-process-pattern` (the daemon's own test); one
whose command line cannot be read (another PID namespace) is not waited for. Restrict the check to vLLM's own
GPUs with `--gpus` when other vLLMs share the host.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from sidecar.model.gpu import GpuReading, ProcessOwner
from sidecar.model.source import SourceResult
from sidecar.model.text import gib

EVERY_S = 0.5


class GpuSource(Protocol):
    async def read(self) -> SourceResult[GpuReading]: ...


def held_by_vllm(reading: GpuReading) -> list[str]:
    """One phrase per vLLM process NVML lists on the watched GPUs, e.g. `pid 4242 (python3) 71.2 GiB on GPU 0`."""
    held = []
    for device in reading.devices:
        for process in device.processes:
            if process.owner is ProcessOwner.VLLM:
                memory = "" if process.used_memory_bytes is None else f" {gib(process.used_memory_bytes)}"
                name = f" ({process.name})" if process.name else ""
                held.append(f"pid {process.pid}{name}{memory} on GPU {device.index}")
    return held


async def wait_released(
    source: GpuSource,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tuple[int, str]:
    """The exit code and the one line to print: 0 once no vLLM process holds GPU memory, 1 at `timeout_s`."""
    started = clock()
    while True:
        result = await source.read()
        if result.value is None:
            return 0, f"cannot read the GPUs ({result.error}): nothing to wait for"
        held = held_by_vllm(result.value)
        waited = clock() - started
        if not held:
            cards = ", ".join(str(device.index) for device in result.value.devices) or "none"
            after = f" after {waited:.1f} s" if waited > 0 else ""
            return 0, f"no vLLM process holds GPU memory (GPUs: {cards}){after}"
        if waited >= timeout_s:
            return 1, (
                f"vLLM processes still hold GPU memory after {timeout_s:g} s: {'; '.join(held)}; a vLLM started "
                "now would run out of memory (end them, or wait for the driver to release them)"
            )
        await sleep(EVERY_S)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="how long to wait (default 60)")
    parser.add_argument(
        "--gpus", default=None, metavar="LIST", help="NVML indices of vLLM's GPUs, e.g. 0,1 (default: every GPU)"
    )
    parser.add_argument(
        "--vllm-process-pattern",
        default=None,
        metavar="REGEX",
        help="a process whose command line matches is vLLM's (default: the daemon's, vllm|VLLM::)",
    )


def run(args: argparse.Namespace) -> int:
    import re  # noqa: PLC0415

    from sidecar.shell.settings import parse_gpu_indices  # noqa: PLC0415
    from sidecar.sources.nvml import NvmlSource  # noqa: PLC0415 - pynvml only for this command
    from sidecar.sources.proc import DEFAULT_VLLM_PATTERN  # noqa: PLC0415

    timeout_s = float(args.timeout)
    if not timeout_s >= 0:
        print(f"vllm-sidecar: error: --timeout {args.timeout}: must be >= 0 seconds", file=sys.stderr)
        return 2
    try:
        indices = parse_gpu_indices(args.gpus or "all")
    except ValueError as error:
        print(f"vllm-sidecar: error: --gpus {args.gpus}: {error}", file=sys.stderr)
        return 2
    pattern = args.vllm_process_pattern or DEFAULT_VLLM_PATTERN
    try:
        source = NvmlSource(gpu_indices=indices, vllm_process_pattern=pattern, timeout_s=10.0, retry_init_s=0.0)
    except re.error as error:
        print(f"vllm-sidecar: error: --vllm-process-pattern {pattern}: {error}", file=sys.stderr)
        return 2
    try:
        code, line = asyncio.run(wait_released(source, timeout_s=timeout_s))
    finally:
        source.close()
    print(f"vllm-sidecar wait-gpu: {line}", file=sys.stdout if code == 0 else sys.stderr)
    return code
