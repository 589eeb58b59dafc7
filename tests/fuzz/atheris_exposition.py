"""Coverage-guided fuzzing (atheris, libFuzzer) of what turns vLLM's bytes into a reading, and of the HTTP head parser.

Not part of pytest (atheris is not a dev dependency: `pip install atheris`, Python <= 3.11 wheels). Run:

    python -m tests.fuzz.atheris_exposition --seconds 300                  # the exposition path (default)
    python -m tests.fuzz.atheris_exposition --seconds 60 --target http      # the daemon's request parser
    python -m tests.fuzz.atheris_exposition --seconds 60 -- -jobs=2         # extra flags go to libFuzzer

The corpus starts from the recorded expositions in tests/fixtures and lives in a scratch folder (never the
repository); a crash is written as `crash-*` there and its path printed. What a target checks is what the
property tests check (tests/property), so a crash here is a failing property with its input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# atheris has no type information; it is reached through importlib so mypy sees Any, not a missing module.
atheris: Any = importlib.import_module("atheris")

with atheris.instrument_imports():  # coverage feedback from our code only, not the standard library's
    from sidecar.exporter.http import BadRequestError, _read_request
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


async def _parse_head(data: bytes) -> None:
    reader = asyncio.StreamReader(limit=16 * 1024)
    reader.feed_data(data)
    reader.feed_eof()
    with contextlib.suppress(BadRequestError, asyncio.IncompleteReadError):
        await _read_request(reader, "127.0.0.1:1", 64 * 1024)


def http_target(data: bytes) -> None:
    """The daemon's request parser: a Request or BadRequestError, never anything else."""
    _LOOP.run_until_complete(_parse_head(data))


TARGETS = {"exposition": exposition_target, "http": http_target}
HTTP_SEEDS = (
    b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n\r\n",
    b"POST /admin/pause HTTP/1.1\r\nAuthorization: Bearer 0123456789abcdef\r\nContent-Length: 2\r\n\r\n{}",
    b"HEAD /status?x=1 HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
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
