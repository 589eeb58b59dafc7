"""`vllm-sidecar doctor`: its flags (`add_arguments`) and the run (`run`). Does I/O: stdout, stderr, exit code.

Exit codes, like a linter (the contract's): 0 no findings, 1 findings (`--fail-on warning` lets info advice pass), 2
could not diagnose (nothing readable, or a file named on the command line that cannot be read), with one line
on stderr saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field

from sidecar.config.config_file import SettingsError
from sidecar.config.settings_cli import settings_flags
from sidecar.config.tool_settings import ReportSettings, load_tool_settings

EXIT_USAGE = 2


class DoctorSettings(ReportSettings):
    """The doctor's options, with their defaults: flag > VLLM_SIDECAR_<OPTION> > config file > these."""

    vllm_url: str = Field("http://127.0.0.1:8000", description="base URL of the vLLM server")
    vllm_log: Path | None = Field(
        None,
        description="vLLM's log (stdout/stderr of its start, a refused start or a crash), '-' for stdin (kubectl "
        "logs ... | vllm-sidecar doctor --vllm-log -); works with vLLM not running",
    )
    history: str | None = Field(
        None,
        description="the sidecar daemon's history: its /status URL, a saved /status JSON, or its --state-dir",
        json_schema_extra={"metavar": "URL|FILE|DIR"},
    )
    incident: Path | None = Field(
        None,
        description="an incident folder the daemon kept (<state-dir>/incidents/...): its log, metrics and /status "
        "history instead of a live vLLM and --history",
    )
    vllm_command: str | None = Field(
        None,
        description="the command that started vLLM (vllm serve MODEL --gpu-memory-utilization 0.85 ..., or its flags "
        "alone), for a --vllm-log or --incident whose log does not state them: values instead of steps where the "
        "reading needs the budget or the batch sizes; vLLM's own arguments line, where the log has one, wins",
        json_schema_extra={"metavar": "TEXT"},
    )
    gpu_source: Literal["nvml", "sim", "none"] = Field(
        "nvml", description="nvml; sim: the simulator's /sim/gpu at --vllm-url; none"
    )
    gpus: str = Field("all", description="GPU indices: all, or a list such as 0,1")
    vllm_process_pattern: str = Field(
        r"vllm|VLLM::", description="regular expression matched on a GPU process's name to tell vLLM from other tenants"
    )
    # Not `timeout`: the daemon's (shorter than its poll interval) must not reach the doctor from the environment
    # or a shared config file; --timeout is its flag.
    request_timeout: float = Field(
        10.0, gt=0, le=300, description="seconds each request to vLLM may take", json_schema_extra={"unit": "seconds"}
    )
    fail_on: Literal["info", "warning", "critical"] = Field(
        "info", description="exit 1 when a finding is at least this severe (info: any finding)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings_flags(DoctorSettings, parser, shortcuts={"request_timeout": "timeout"})


def _gpu_indices(text: str) -> tuple[int, ...] | None:
    if text.strip().lower() == "all":
        return None
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--gpus must be 'all' or a list such as 0,1, got {text!r}") from None
    if any(index < 0 for index in indices):
        raise ValueError(f"--gpus must not be negative, got {text!r}")
    return indices


def _checked_url(text: str, option: str) -> str:
    """An http(s) URL with a host and a valid port, or ValueError naming the option."""
    import httpx  # noqa: PLC0415 - keeps --help fast

    problem = f"{option} must be an http:// or https:// URL with a host, got {text!r}"
    try:
        url = httpx.URL(text)
        port = url.port
    except (httpx.InvalidURL, ValueError):
        raise ValueError(problem) from None
    if url.scheme not in ("http", "https") or not url.host or (port is not None and not 0 < port < 2**16):
        raise ValueError(problem)
    return text


def run(flags: argparse.Namespace) -> int:
    from sidecar.doctor.diagnose import diagnose  # noqa: PLC0415 - keeps the CLI's start light
    from sidecar.doctor.finding import Severity  # noqa: PLC0415
    from sidecar.doctor.render import exit_code, render_json, render_text  # noqa: PLC0415
    from sidecar.doctor.start_args import stated_command  # noqa: PLC0415
    from sidecar.doctor_cli.gather import InputError, Options, gather  # noqa: PLC0415

    try:
        args = load_tool_settings(DoctorSettings, flags)
    except SettingsError as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.vllm_command is not None and args.vllm_log is None and args.incident is None:
        print(
            "vllm-sidecar: error: --vllm-command gives the flags of a log's start: give --vllm-log or --incident too",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        options = Options(
            vllm_url=_checked_url(str(args.vllm_url), "--vllm-url"),
            vllm_log=Path(args.vllm_log) if args.vllm_log is not None else None,
            history=_checked_url(args.history, "--history")
            if args.history is not None and "://" in args.history
            else args.history,
            gpu_source=str(args.gpu_source),
            gpu_indices=_gpu_indices(str(args.gpus)),
            vllm_process_pattern=str(args.vllm_process_pattern),
            timeout_s=args.request_timeout,
            incident=Path(args.incident) if args.incident is not None else None,
            command=stated_command(args.vllm_command) if args.vllm_command is not None else None,
        )
        evidence = asyncio.run(gather(options))
    except (InputError, ValueError) as error:
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    diagnosis = diagnose(evidence)
    if args.json:
        print(render_json(diagnosis))
    elif diagnosis.diagnosable:
        print(render_text(diagnosis))
    if not diagnosis.diagnosable:
        print(f"vllm-sidecar: error: {diagnosis.reason}", file=sys.stderr)
    return exit_code(diagnosis, Severity(str(args.fail_on)))
