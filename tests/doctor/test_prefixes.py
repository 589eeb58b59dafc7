"""Every real corpus log, wrapped in each line prefix an operator's tooling adds, gives the same finding.

The prefixes are the documented formats of the tools: journalctl's default `short` output (`Mon DD HH:MM:SS host
identifier[pid]: `, journalctl(1) --output=short), `kubectl logs --timestamps` (an RFC 3339 timestamp with
nanoseconds and a space before each line), `docker compose logs` (the container name padded, then `| `), Ray's
driver-side worker redirection (`(ActorName pid=N, ip=A.B.C.D) `), vLLM's own multiprocess prefix
(`(EngineCore_DP0 pid=N) `), and two launchers' tags that no token shape describes (DJL Serving's
`WARN  PyProcess W-7-model-stderr: `, a job's `serve-job.err: `). Each logical line of the log (a message a paste
wrapped is put back first, as the tool would have seen it) gets the prefix; the doctor must name the same cause
and recommend the same values.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import main
from sidecar.doctor.log_parser import rejoin
from tests.doctor.corpus_verdict import CORPUS, verdict
from tests.doctor.test_corpus import ENTRIES
from tests.loopback import closed_port

PREFIXES: dict[str, Callable[[int], str]] = {
    "journald": lambda n: f"Nov 26 03:41:{n % 60:02d} gpu-node-3 vllm[1234]: ",
    "kubectl-timestamps": lambda n: f"2026-11-26T03:41:{n % 60:02d}.084084123Z ",
    "docker-compose": lambda _: "vllm-1  | ",
    "ray-worker": lambda _: "(RayWorkerWrapper pid=4123, ip=10.0.0.7) ",
    "engine-core": lambda _: "(EngineCore_DP0 pid=7) ",
    # A launcher's own tag, which no token shape describes: learned because every line repeats it.
    "launcher-tag": lambda _: "WARN  PyProcess W-7-model-stderr: ",
    "job-tag": lambda _: "serve-job.err: ",
}
# Logs that already carry an outer prefix of their own (a `> ` quote, CI timestamps, compose) are not wrapped again:
# no tool puts journald in front of a markdown quote.
_OUTER = re.compile(r"^(?:> |\[\d{4}-\d\d-\d\dT|\S+\s+\| )")


def _raw(entry: dict[str, Any]) -> list[str]:
    text: str = (CORPUS / entry["file"]).read_text(encoding="utf-8")
    return text.splitlines()


WRAPPABLE = [entry for entry in ENTRIES if not any(_OUTER.match(line) for line in _raw(entry))]


def _doctor(path: Path) -> tuple[int, dict[str, Any]]:
    """`doctor --vllm-log PATH --json`, as a user runs it, in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "doctor",
                "--vllm-log",
                str(path),
                "--json",
                "--gpu-source",
                "none",
                "--vllm-url",
                f"http://127.0.0.1:{closed_port()}",
            ]
        )
    return code, json.loads(out.getvalue())


@functools.cache
def _plain(file: str) -> tuple[int, dict[str, Any]]:
    """The bare log's reading, once for its seven prefixes (half of this module's time was reading it again)."""
    return _doctor(CORPUS / file)


def _verdict(document: dict[str, Any]) -> tuple[str, list[tuple[str, object]]]:
    if not document.get("findings"):
        return "", []
    finding = document["findings"][0]
    return finding["cause"], [(r["flag"], r["value"]) for r in finding["recommendations"]]


def test_most_of_the_corpus_is_wrapped() -> None:
    assert len(WRAPPABLE) >= 20, [entry["file"] for entry in WRAPPABLE]


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
@pytest.mark.parametrize("entry", WRAPPABLE, ids=[entry["file"] for entry in WRAPPABLE])
def test_a_prefixed_log_gives_the_same_finding(entry: dict[str, Any], prefix: str, tmp_path: Path) -> None:
    plain_code, plain = _plain(entry["file"])
    make = PREFIXES[prefix]
    wrapped = tmp_path / entry["file"]
    wrapped.write_text("".join(make(n) + line + "\n" for n, line in enumerate(rejoin(_raw(entry)))), encoding="utf-8")
    code, document = _doctor(wrapped)
    assert (code, _verdict(document)) == (plain_code, _verdict(plain))
    assert verdict(entry, code, document) is verdict(entry, plain_code, plain)
