"""Records `exposition_conformance_cases.json`: the published parser test cases and what Prometheus does with them.

Not a test: a tool, run by hand when the cases should be refreshed (it needs the upstream checkouts, and the
`prometheus` and `promtool` binaries on PATH; Debian's 2.42 were used). It does I/O: it reads the upstream
test files, serves each case over HTTP to a real Prometheus and reads the verdicts back.

    python -m tests.unit.exposition_conformance_record PROMETHEUS COMMON CLIENT_PYTHON OPENMETRICS

Each argument is a checkout of that repository (prometheus/prometheus, prometheus/common,
prometheus/client_python, prometheus/OpenMetrics). The inputs are taken as the test files give them; their
own verdicts are kept as `upstream` (OpenMetrics' are about the OpenMetrics format, Prometheus' and
expfmt's about their parser at that commit). Then every input is judged, as format 0.0.4, by:

- `prometheus`: a Prometheus server scraping it (`Content-Type: text/plain; version=0.0.4`): the target is up
  (accepted) or down with the scrape's error. This is promparse.go plus the scrape loop's own check of
  repeated label names. `samples`: the series it stored, with their values; `samples_complete` is false when
  it stored fewer than it scraped (samples with old timestamps are parsed, then refused by the TSDB).
- `expfmt`: `promtool check metrics` (prometheus/common's expfmt.TextParser): rejected when it reports a
  text format parsing error; lint findings do not count.

`expect` is what the sidecar's parser must do: Prometheus' verdict, except for the cases in `DEVIATIONS`,
where `why` says why the sidecar departs from it.
"""

from __future__ import annotations

import contextlib
import http.server
import inspect
import json
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).with_name("exposition_conformance_cases.json")
PROMPARSE_TEST = "prometheus/prometheus model/textparse/promparse_test.go"
EXPFMT_TEST = "prometheus/common expfmt/text_parse_test.go"
CLIENT_PYTHON_TEST = "prometheus/client_python tests/test_parser.py"
OPENMETRICS_DATA = "prometheus/OpenMetrics tests/testdata/parsers"

# (source, case) -> why the sidecar does not do what Prometheus does with it.
DEVIATIONS = {
    (EXPFMT_TEST, "testTextParseError #2"): (
        "Prometheus' lexer reads a quoted label value across a line break; the format escapes a newline in a "
        "label value as \\n, expfmt and OpenMetrics refuse a raw one, and the sidecar reads line by line "
        "(its picker finds a sample by its line): refused."
    ),
}

Case = dict[str, Any]


def _go_literal(source: str, at: int) -> tuple[bytes, int]:
    """The Go string literal starting at `at` (raw or interpreted) as bytes, and the index after it."""
    if source[at] == "`":
        end = source.index("`", at + 1)
        return source[at + 1 : end].replace("\r", "").encode(), end + 1
    simple = {"n": b"\n", "t": b"\t", '"': b'"', "\\": b"\\", "r": b"\r", "'": b"'", "a": b"\a", "b": b"\b"}
    out = bytearray()
    pos = at + 1
    while source[pos] != '"':
        char = source[pos]
        if char != "\\":
            out += char.encode()
            pos += 1
            continue
        escaped = source[pos + 1]
        if escaped in simple:
            out += simple[escaped]
            pos += 2
        elif escaped == "x":
            out.append(int(source[pos + 2 : pos + 4], 16))
            pos += 4
        elif escaped == "u":
            out += chr(int(source[pos + 2 : pos + 6], 16)).encode()
            pos += 6
        else:
            raise ValueError(f"escape not handled: {source[pos : pos + 6]!r}")
    return bytes(out), pos + 1


def _go_concatenation(source: str, at: int) -> tuple[bytes, int]:
    data, end = _go_literal(source, at)
    plus = re.compile(r"\s*\+\s*(?=[`\"])")
    while (more := plus.match(source, end)) is not None:
        tail, end = _go_literal(source, more.end())
        data += tail
    return data, end


def _go_cases(path: Path, source: str, verdicts: dict[str, str | None]) -> list[Case]:
    """The `in:`/`input:` literals of the Go test functions named in `verdicts` (None: by the `err` after it)."""
    text = path.read_text()
    functions = [(match.start(), match.group(1)) for match in re.finditer(r"^func (\w+)", text, re.MULTILINE)]
    cases: list[Case] = []
    counts: dict[str, int] = {}
    for match in re.finditer(r"\b(in|input)\s*(:=|\+=|:|=)\s*(?=[`\"])", text):
        data, end = _go_concatenation(text, match.end())
        function = [name for start, name in functions if start < match.start()][-1]
        if function not in verdicts:
            continue
        if match.group(2) == "+=":
            cases[-1]["data"] += data
            continue
        verdict = verdicts[function]
        error = re.match(r"\s*,\s*(?:err|errUTF8)\s*:\s*(?=[`\"])", text[end:])
        message = _go_concatenation(text, end + error.end())[0].decode("utf-8", "replace") if error else ""
        if verdict is None:
            verdict = "reject" if message else "accept"
        number = counts[function] = counts.get(function, -1) + 1
        cases.append({"source": source, "case": f"{function} #{number}", "data": data, "upstream": verdict})
    return cases


def _client_python_cases(checkout: Path) -> list[Case]:
    """Every text client_python's parser tests hand to the parser, by running those tests with a spy."""
    sys.path[:0] = [str(checkout), str(checkout / "tests")]
    # The checkout's own parser and tests, put on the path above.
    import prometheus_client.parser as parser_module
    import test_parser  # type: ignore[import-not-found]

    real = parser_module.text_string_to_metric_families
    calls: list[tuple[str, str]] = []
    current = [""]

    def spy(text: str) -> Any:
        calls.append((current[0], text))
        return real(text)

    test_parser.text_string_to_metric_families = spy
    cases: list[Case] = []
    for _, test_class in inspect.getmembers(test_parser, inspect.isclass):
        if not issubclass(test_class, unittest.TestCase):
            continue
        for method in sorted(name for name in dir(test_class) if name.startswith("test")):
            current[0] = f"{test_class.__name__}.{method}"
            expects_error = "assertRaises" in inspect.getsource(getattr(test_class, method))
            before = len(calls)
            result = unittest.TestResult()
            test_class(method).run(result)
            if result.errors or result.failures:
                raise SystemExit(f"{method} fails: {result.errors or result.failures}")
            for number, (_, text) in enumerate(calls[before:]):
                cases.append(
                    {
                        "source": CLIENT_PYTHON_TEST,
                        "case": f"{current[0]} #{number}",
                        "data": text.encode(),
                        "upstream": "reject" if expects_error else "accept",
                    }
                )
    return cases


def _openmetrics_cases(checkout: Path) -> list[Case]:
    cases: list[Case] = []
    for folder in sorted((checkout / "tests/testdata/parsers").iterdir()):
        meta = json.loads((folder / "test.json").read_text())
        cases.append(
            {
                "source": OPENMETRICS_DATA,
                "case": folder.name,
                "data": (folder / meta["file"]).read_bytes(),
                "upstream": "accept" if meta["shouldParse"] else "reject",
            }
        )
    return cases


def _judge_with_expfmt(cases: list[Case]) -> None:
    for case in cases:
        done = subprocess.run(["promtool", "check", "metrics"], input=case["data"], capture_output=True, check=False)
        said = (done.stdout + done.stderr).decode("utf-8", "replace").splitlines()
        errors = [line.removeprefix("error while linting: ") for line in said if "error while linting" in line]
        case["expfmt"] = "reject" if errors else "accept"
        case["expfmt_error"] = errors[0] if errors else None


@contextlib.contextmanager
def _serving(cases: list[Case]) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = cases[int(self.path.rsplit("/", 1)[1])]["data"]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def _judge_with_prometheus(cases: list[Case]) -> None:
    folder = Path(tempfile.mkdtemp())
    with _serving(cases) as port:
        targets = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/c/{i}", "conformance_case": str(i)}}
            for i in range(len(cases))
        ]
        (folder / "targets.json").write_text(json.dumps(targets))
        (folder / "prometheus.yml").write_text(
            "global: {scrape_interval: 5s, scrape_timeout: 4s}\n"
            "scrape_configs:\n- job_name: c\n  honor_labels: true\n"
            f"  file_sd_configs: [{{files: ['{folder}/targets.json']}}]\n"
        )
        web = "127.0.0.1:19731"
        arguments = [f"--config.file={folder}/prometheus.yml", f"--storage.tsdb.path={folder}/data"]
        process = subprocess.Popen(
            ["prometheus", *arguments, f"--web.listen-address={web}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def get(path: str) -> Any:
            with urllib.request.urlopen(f"http://{web}{path}") as answer:
                return json.load(answer)["data"]

        try:
            for _ in range(180):
                time.sleep(1)
                with contextlib.suppress(OSError):
                    targets_seen = get("/api/v1/targets")["activeTargets"]
                    scraped = [t for t in targets_seen if t["lastScrape"] != "0001-01-01T00:00:00Z"]
                    if len(scraped) == len(cases):
                        break
            time.sleep(6)  # a second round, so that every verdict is a settled one
            for target in get("/api/v1/targets")["activeTargets"]:
                case = cases[int(target["labels"]["conformance_case"])]
                case["prometheus"] = "accept" if target["health"] == "up" else "reject"
                case["prometheus_error"] = target["lastError"] or None
            query = urllib.parse.urlencode({"query": '{conformance_case!=""}'})
            for case in cases:
                case["samples"], case["scraped"] = [], 0
            for series in get(f"/api/v1/query?{query}")["result"]:
                labels = dict(series["metric"])
                case = cases[int(labels.pop("conformance_case"))]
                name = labels.pop("__name__")
                if labels.get("job") == "c":
                    labels.pop("job")
                if labels.get("instance") == f"127.0.0.1:{port}":
                    labels.pop("instance")
                if name == "scrape_samples_scraped":
                    case["scraped"] = int(series["value"][1])
                elif name != "up" and not name.startswith("scrape_"):
                    case["samples"].append([name, sorted(labels.items()), series["value"][1]])
        finally:
            process.terminate()
            process.wait()
            shutil.rmtree(folder)


def main(prometheus: Path, common: Path, client_python: Path, openmetrics: Path) -> None:
    cases = (
        _go_cases(
            prometheus / "model/textparse/promparse_test.go",
            PROMPARSE_TEST,
            {
                "TestPromParse": "accept",
                "TestUTF8PromParse": "accept",
                "TestPromParseErrors": "reject",
                "TestPromNullByteHandling": None,
            },
        )
        + _go_cases(
            common / "expfmt/text_parse_test.go", EXPFMT_TEST, {"testTextParse": "accept", "testTextParseError": None}
        )
        + _client_python_cases(client_python)
        + _openmetrics_cases(openmetrics)
    )
    _judge_with_expfmt(cases)
    _judge_with_prometheus(cases)
    for case in cases:
        if "prometheus" not in case or (case["prometheus_error"] or "").startswith("Get "):
            raise SystemExit(f"no settled verdict for {case['source']} {case['case']}: run again")
    written = []
    for case in cases:
        why = DEVIATIONS.get((case["source"], case["case"]))
        expect = case["prometheus"] if why is None else ("reject" if case["prometheus"] == "accept" else "accept")
        record = {
            "source": case["source"],
            "case": case["case"],
            # An input that is not UTF-8 keeps its bytes as lone surrogates (decode it with surrogateescape).
            "text": case["data"].decode("utf-8", "surrogateescape"),
            "upstream": case["upstream"],
            "prometheus": case["prometheus"],
            "prometheus_error": case["prometheus_error"],
            "expfmt": case["expfmt"],
            "expfmt_error": case["expfmt_error"],
            "expect": expect,
        }
        if why is not None:
            record["why"] = why
        if case["prometheus"] == "accept":
            record["samples"] = sorted(case["samples"])
            record["samples_complete"] = len(case["samples"]) == case["scraped"]
        written.append(record)
    OUTPUT.write_text(json.dumps(written, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {len(written)} cases to {OUTPUT}")


if __name__ == "__main__":
    main(*(Path(argument) for argument in sys.argv[1:5]))
