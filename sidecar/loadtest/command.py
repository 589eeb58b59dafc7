"""`vllm-sidecar loadtest`: its flags (`add_arguments`) and the run (`run`). Does I/O: the prompts file,
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The loadtest flags, on the subcommand's parser."""
    parser.add_argument(
        "--url",
        "--vllm-url",
        dest="url",
        default="http://127.0.0.1:8000",
        help="base URL of the OpenAI-compatible server (default %(default)s)",
    )
    parser.add_argument(
        "--api",
        choices=[str(api) for api in Api],
        default=str(Api.COMPLETIONS),
        help="completions: POST /v1/completions; chat: POST /v1/chat/completions (default %(default)s)",
    )
    parser.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY' (default: none)")
    # Not required here: a default from VLLM_SIDECAR_RATE or a config file must count; LoadSpec checks one is set.
    arrivals = parser.add_mutually_exclusive_group()
    arrivals.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson arrivals at R requests/s")
    arrivals.add_argument("--concurrency", type=int, metavar="N", help="closed loop: N workers back to back")
    parser.add_argument("--duration", type=float, metavar="S", help="stop sending after S seconds")
    parser.add_argument("--max-requests", type=int, metavar="N", help="stop sending after N requests")
    parser.add_argument(
        "--timeout",
        dest="request_timeout",  # not `timeout`: the daemon's VLLM_SIDECAR_TIMEOUT (< its interval) must not leak in
        type=float,
        default=120.0,
        metavar="S",
        help="per request, in seconds (default %(default)g)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=1000,
        metavar="N",
        help="open loop: an arrival with N requests in flight is dropped by the client (default %(default)s)",
    )
    length_help = "tokens: N, uniform:MIN-MAX or normal:MEAN,SD (default %(default)s)"
    parser.add_argument("--prompt-tokens", default=None, metavar="SPEC", help=length_help.replace("%(default)s", "256"))
    parser.add_argument("--output-tokens", default="128", metavar="SPEC", help=length_help)
    parser.add_argument(
        "--prompts-file",
        type=Path,
        default=None,
        metavar="FILE",
        help='JSON lines {"prompt": ..., "max_tokens": ...} (max_tokens optional), sent in turn',
    )
    parser.add_argument(
        "--shared-prefix-ratio",
        type=float,
        default=0.0,
        metavar="P",
        help="share of requests that start with a shared prefix, 0 to 1 (default %(default)g)",
    )
    parser.add_argument("--shared-prefixes", type=int, default=1, metavar="K", help="how many (default %(default)s)")
    parser.add_argument(
        "--shared-prefix-tokens", type=int, default=64, metavar="T", help="their length (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="for arrivals and lengths (default %(default)s)")
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        metavar="RATIO",
        help="FAIL when more than this share of requests fail (default %(default)g)",
    )
    parser.add_argument(
        "--readiness-url",
        default=None,
        metavar="URL",
        help="send only while this URL answers 200 (e.g. the sidecar's /readyz), as a Kubernetes Service or "
        "router honours readiness; arrivals while it does not are counted as not_ready",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def build_spec(args: argparse.Namespace, *, run_tag: str | None = None) -> LoadSpec:
    """The run's options from the parsed flags (and the prompts file); raises SpecError."""
    prompts: tuple[PromptEntry, ...] = ()
    if args.prompts_file is not None:
        if args.prompt_tokens is not None:
            raise SpecError("--prompt-tokens does not apply to --prompts-file: the file has the prompts")
        prompts = parse_prompts(_read_prompts_file(args.prompts_file), str(args.prompts_file))
    return LoadSpec(
        url=args.url,
        api=Api(args.api),
        model=args.model,
        api_key=args.api_key,
        rate_per_s=args.rate,
        concurrency=args.concurrency,
        duration_s=args.duration,
        max_requests=args.max_requests,
        timeout_s=args.request_timeout,
        max_in_flight=args.max_in_flight,
        # str(): a config file may give a length as a number
        prompt_tokens=parse_length(str(args.prompt_tokens or 256), "--prompt-tokens"),
        output_tokens=parse_length(str(args.output_tokens), "--output-tokens"),
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


def run(args: argparse.Namespace) -> int:
    """Run the load test the flags describe, print the report; the exit code."""
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
    print(f"{_PROG}: error: {message}", file=sys.stderr)
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
