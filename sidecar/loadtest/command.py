"""`vllm-sidecar loadtest`: its settings and flags (`add_arguments`) and the run (`run`). Does I/O: the prompts file,
the network through the runner, stdout for the report, stderr for errors and the progress bar.

Exit codes: 0 PASS or WARN, 1 FAIL, 2 bad arguments or a server that cannot be used at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
from pathlib import Path

from pydantic import Field, field_validator

from sidecar.config.config_file import SettingsError
from sidecar.config.settings_cli import settings_flags
from sidecar.config.tool_settings import ReportSettings, load_tool_settings
from sidecar.loadtest.monitor import UnreachableError
from sidecar.loadtest.report import render_json, render_text
from sidecar.loadtest.runner import POOL_SLACK, ProgressSink, run_load
from sidecar.loadtest.spec import Api, LoadSpec, PromptEntry, SpecError, parse_length, parse_prompts
from sidecar.loadtest.summary import Verdict, summarise

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
MAX_PROMPTS_FILE_BYTES = 1 << 30
_PROG = "vllm-sidecar loadtest"
_LENGTH = "a length in tokens: N, uniform:MIN-MAX or normal:MEAN,SD"


class LoadtestSettings(ReportSettings):
    """The loadtest's options, with their defaults: flag > VLLM_SIDECAR_<OPTION> > config file > these."""

    url: str = Field("http://127.0.0.1:8000", description="base URL of the OpenAI-compatible server")
    api: Api = Field(Api.COMPLETIONS, description="completions: POST /v1/completions; chat: POST /v1/chat/completions")
    model: str | None = Field(None, description="model name (unset: the first of GET /v1/models)")
    api_key: str | None = Field(None, description="sent as 'Authorization: Bearer KEY'")
    # Not required here: a value from VLLM_SIDECAR_RATE or a config file must count; LoadSpec checks that exactly
    # one of the two is set.
    rate: float | None = Field(None, description="open loop: Poisson arrivals at this many requests/s")
    concurrency: int | None = Field(None, description="closed loop: this many workers back to back")
    duration: float | None = Field(None, description="stop sending after this many seconds")
    max_requests: int | None = Field(None, description="stop sending after this many requests")
    # Not `timeout`: the daemon's VLLM_SIDECAR_TIMEOUT (< its interval) must not leak in; --timeout is its flag.
    request_timeout: float = Field(120.0, description="per request, in seconds")
    max_in_flight: int = Field(
        1000, description="open loop: an arrival with this many requests in flight is dropped by the client"
    )
    prompt_tokens: str | None = Field(None, description="LENGTH (unset: 256); " + _LENGTH)
    output_tokens: str = Field("128", description="LENGTH; " + _LENGTH)
    prompts_file: Path | None = Field(
        None, description='JSON lines {"prompt": ..., "max_tokens": ...} (max_tokens optional), sent in turn'
    )
    shared_prefix_ratio: float = Field(0.0, description="share of requests that start with a shared prefix, 0 to 1")
    shared_prefixes: int = Field(1, description="how many shared prefixes")
    shared_prefix_tokens: int = Field(64, description="their length in tokens")
    seed: int = Field(0, description="for arrivals and lengths")
    max_error_rate: float = Field(0.01, description="FAIL when more than this share of requests fail")
    readiness_url: str | None = Field(
        None,
        description="send only while this URL answers 200 (e.g. the sidecar's /readyz), as a Kubernetes Service or "
        "router honours readiness; arrivals while it does not are counted as not_ready",
    )
    quiet: bool = Field(False, description="no progress bar")

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _length_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The loadtest flags, on the subcommand's parser."""
    settings_flags(LoadtestSettings, parser, shortcuts={"url": "vllm-url", "request_timeout": "timeout"})


def build_spec(args: LoadtestSettings, *, run_tag: str | None = None) -> LoadSpec:
    """The run's options from its settings (and the prompts file); raises SpecError."""
    prompts: tuple[PromptEntry, ...] = ()
    if args.prompts_file is not None:
        if args.prompt_tokens is not None:
            raise SpecError("--prompt-tokens does not apply to --prompts-file: the file has the prompts")
        prompts = parse_prompts(_read_prompts_file(args.prompts_file), str(args.prompts_file))
    return LoadSpec(
        url=args.url,
        api=args.api,
        model=args.model,
        api_key=args.api_key,
        rate_per_s=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        max_requests=args.max_requests,
        timeout_s=args.request_timeout,
        max_in_flight=args.max_in_flight,
        # str(): a config file may give a length as a number
        prompt_tokens=parse_length(args.prompt_tokens or "256", "--prompt-tokens"),
        output_tokens=parse_length(args.output_tokens, "--output-tokens"),
        prompts=prompts,
        prompts_file=None if args.prompts_file is None else str(args.prompts_file),
        shared_prefix_ratio=args.shared_prefix_ratio,
        shared_prefixes=args.shared_prefixes,
        shared_prefix_tokens=args.shared_prefix_tokens,
        seed=args.seed,
        max_error_rate=args.max_error_rate,
        readiness_url=args.readiness_url,
        run_tag=run_tag if run_tag is not None else f"r{secrets.token_hex(3)}",
    )


def run(flags: argparse.Namespace) -> int:
    """Run the load test the flags (over the environment and the config file) describe, print the report; the
    exit code."""
    try:
        args = load_tool_settings(LoadtestSettings, flags)
    except SettingsError as error:  # worded like every command's settings error
        print(f"vllm-sidecar: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        spec = build_spec(args)
    except SpecError as error:
        return _usage_error(str(error))
    _raise_open_files_limit((spec.concurrency or spec.max_in_flight) + POOL_SLACK + 64)
    from sidecar.loadtest import progress  # noqa: PLC0415 - rich is only loaded for a run that may show it

    bar = progress.ProgressBar() if progress.wanted(quiet=args.quiet) else None
    try:
        with bar if bar is not None else contextlib.nullcontext():
            sink: ProgressSink | None = bar
            outcome = asyncio.run(run_load(spec, sink=sink))
    except (UnreachableError, SpecError) as error:
        return _usage_error(str(error))
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted; no report", file=sys.stderr)
        return EXIT_INTERRUPTED
    summary = summarise(
        spec,
        outcome.results,
        model=outcome.info.model,
        max_model_len=outcome.info.max_model_len,
        sending_s=outcome.sending_s,
        max_send_lag_s=outcome.max_send_lag_s,
        stopped_early=outcome.stopped_early,
        duration_s=outcome.duration_s,
        watch=outcome.watch,
    )
    print(render_json(spec, summary) if args.json else render_text(spec, summary))
    return EXIT_FAIL if summary.verdict is Verdict.FAIL else EXIT_OK


def _usage_error(message: str) -> int:
    print(f"vllm-sidecar: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _read_prompts_file(path: Path) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_PROMPTS_FILE_BYTES + 1)
    except OSError as error:
        raise SpecError(f"--prompts-file {path}: {error.strerror or error}") from None
    if len(data) > MAX_PROMPTS_FILE_BYTES:
        raise SpecError(f"--prompts-file {path}: larger than {MAX_PROMPTS_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"--prompts-file {path}: not UTF-8 (byte {error.start})") from None


def _raise_open_files_limit(wanted: int) -> None:
    """Each request in flight holds a socket; lift the soft limit towards the hard one where it is lower."""
    try:
        import resource  # noqa: PLC0415 - POSIX only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, OSError, ValueError):
        return  # the run goes on; a request that cannot open a socket is counted as a failure
