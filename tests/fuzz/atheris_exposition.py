"""Coverage-guided fuzzing (atheris, libFuzzer) of what turns vLLM's bytes into a reading, and of the daemon's routes.

Not part of pytest (atheris is not a dev dependency: `pip install atheris`, Python <= 3.11 wheels). Run:

    python -m tests.fuzz.atheris_exposition --seconds 300                  # the exposition path (default)
    python -m tests.fuzz.atheris_exposition --seconds 60 --target http      # the daemon's routes and admin check
    python -m tests.fuzz.atheris_exposition --seconds 60 -- -jobs=2         # extra flags go to libFuzzer

The corpus starts from the recorded expositions in tests/fixtures and lives in a scratch folder (never the
repository); a crash is written as `crash-*` there and its path printed. What a target checks is what the
property tests check (tests/property), so a crash here is a failing property with its input.

The http target starts after aiohttp has parsed a request (its parser is aiohttp's to fuzz, and is): what is
ours is the routing, the OpenMetrics negotiation on Accept, the admin rate limit and the bearer token check.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

# atheris has no type information; it is reached through importlib so mypy sees Any, not a missing module.
atheris: Any = importlib.import_module("atheris")

with atheris.instrument_imports():  # coverage feedback from our code only, not the standard library's
    from sidecar.exporter.admin import AdminAuth
    from sidecar.exporter.endpoints import Endpoints, Liveness
    from sidecar.exporter.rate_limit import AdminRateLimiter, RateLimit
    from sidecar.exporter.server import Request
    from sidecar.model.exposition import Exposition
    from sidecar.parse.exposition import ExpositionError, parse_exposition
    from sidecar.parse.vllm import KEPT_SAMPLES, read_vllm, vllm_sample_picker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "expositions"
_LOOP = asyncio.new_event_loop()  # one loop for every input of the http target: a loop per input is most of the cost


_PICKER = vllm_sample_picker()  # one for every input, as the daemon keeps one: its remembered label sets too


def exposition_target(data: bytes) -> None:
    """The source's path after the network: decode, pick, per-engine read (see vllm_http.read); the strict
    parses (full and filtered) beside it as witnesses."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # the source reports it as a problem before parsing
    full: Exposition | None = None
    try:
        full = parse_exposition(text)
    except ExpositionError as error:
        problem = str(error)
        assert "\n" not in problem
    try:
        filtered: Exposition | None = parse_exposition(text, KEPT_SAMPLES)
    except ExpositionError:
        assert full is None, "the filtered parse refused what the full parse accepted"
        filtered = None
    try:
        picked = _PICKER.pick(text)
    except ExpositionError as error:
        problem = str(error)
        assert full is None, "the picker refused what the full parse accepted"
        assert "\n" not in problem
        return
    if full is not None:
        kept = {name: rows for name, rows in _rows(full).items() if name in KEPT_SAMPLES}
        assert filtered is not None
        assert _rows(filtered) == kept
        assert _rows(picked) == kept
    reading = read_vllm(picked, url="http://vllm", version=None)
    assert all("\n" not in problem for problem in reading.problems)


def _rows(exposition: Exposition) -> dict[str, list[tuple[object, str]]]:
    return {name: [(s.labels, _key(s.value)) for s in found] for name, found in exposition.samples.items()}


def _key(value: float) -> str:
    return "nan" if math.isnan(value) else repr(value)


class _Admin:
    def pause(self, caller: str) -> str:
        return f"paused for {caller}"

    def resume(self, caller: str) -> str:
        return f"resumed for {caller}"

    def restart(self, caller: str) -> str:
        return f"restarting for {caller}"


_TOKEN_FILE = Path(tempfile.mkdtemp(prefix="fuzz-http-")) / "token"
_TOKEN_FILE.write_bytes(b"0123456789abcdef\n")
_ENDPOINTS = Endpoints(
    registry=CollectorRegistry(auto_describe=False),
    latest_view=lambda: None,
    liveness=lambda: Liveness(alive=True, reason="ok"),
    vllm_url="http://vllm",
    version="fuzz",
    admin=_Admin(),
    admin_auth=AdminAuth(_TOKEN_FILE),
    admin_rate_limiter=AdminRateLimiter(RateLimit(requests=10_000, period_s=1.0)),
)
_STATUSES = {200, 401, 403, 404, 405, 429}


def http_target(data: bytes) -> None:
    """The routes behind aiohttp: any method, path, Accept, Authorization and body (lines of the input, as
    latin-1, as the server hands them over) get a status from the list and a body, never an exception."""
    method, path, accept, authorization, body = [*data.split(b"\n", 4), b"", b"", b"", b"", b""][:5]
    request = Request(
        method=method.decode("latin-1"),
        path=path.decode("latin-1"),
        headers={"accept": accept.decode("latin-1"), "authorization": authorization.decode("latin-1")},
        body=body,
        peer="127.0.0.1:1",
    )
    response = _LOOP.run_until_complete(_ENDPOINTS.handle(request))
    assert response.status in _STATUSES, response.status
    assert response.content_type.isascii(), response.content_type
    assert response.content_type.isprintable(), response.content_type
    assert all(value.isascii() and "\n" not in value for value in response.headers.values())


TARGETS = {"exposition": exposition_target, "http": http_target}
HTTP_SEEDS = (
    b"GET\n/metrics\napplication/openmetrics-text; version=1.0.0\n\n",
    b"POST\n/admin/pause\n\nBearer 0123456789abcdef\n{}",
    b"HEAD\n/status\n*/*\nbearer x\n",
)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60, help="how long to fuzz (libFuzzer -max_total_time)")
    parser.add_argument("--target", choices=sorted(TARGETS), default="exposition")
    parser.add_argument("--corpus", type=Path, help="corpus folder to keep between runs (default: a scratch one)")
    parser.add_argument("libfuzzer", nargs="*", help="extra libFuzzer flags, after --")
    args = parser.parse_args(argv)
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix=f"fuzz-{args.target}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    if args.target == "exposition":
        for recorded in FIXTURES.glob("*.prom"):
            shutil.copy(recorded, corpus / recorded.name)
    else:
        for number, request in enumerate(HTTP_SEEDS):
            (corpus / f"seed-{number}").write_bytes(request)
    print(f"corpus and crashes: {corpus}", file=sys.stderr)
    flags = [f"-max_total_time={args.seconds}", "-max_len=65536", "-timeout=10", "-rss_limit_mb=2048"]
    atheris.Setup(
        [sys.argv[0], *flags, f"-artifact_prefix={corpus}/", *args.libfuzzer, str(corpus)], TARGETS[args.target]
    )
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv[1:])
