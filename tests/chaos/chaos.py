"""What every chaos test needs: a loopback vLLM whose /metrics a test can break, survival checks on the daemon,
metric parsing with prometheus_client (an independent parser), and a watch that proves counters never went back.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import Behaviour, LoopbackServer, closed_port, respond

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_text()
ENGINE = {"engine": "0", "model_name": "tiny-llama"}
_GENERATION = re.compile(r'^(vllm:generation_tokens_total\{engine="0",model_name="tiny-llama"\}) (\S+)$', re.M)
_RUNNING = re.compile(r'^(vllm:num_requests_running\{engine="0",model_name="tiny-llama"\}) (\S+)$', re.M)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by (sample name, sorted labels), read by prometheus_client."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, context: Callable[[], str] = lambda: ""
) -> float:
    """Poll every 0.1 s until `predicate` holds; the seconds it took. Fails with `what` and the context."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{context()}")
        time.sleep(0.1)
    return time.monotonic() - started


def wait_polls(sidecar: SidecarProcess, count: int, timeout_s: float = 20.0) -> None:
    """Wait until the sidecar has completed `count` more polls: its last-poll timestamp took `count` new values.
    Polls that land between two reads count as one, so this never waits less than `count` polls."""
    values = [value(scrape(sidecar), "vllm_sidecar_last_poll_timestamp_seconds")]

    def another() -> bool:
        latest = value(scrape(sidecar), "vllm_sidecar_last_poll_timestamp_seconds")
        if latest is not None and latest != values[-1]:
            values.append(latest)
        return len(values) > count

    wait_until(another, timeout_s, f"{count} more polls")


class VllmStandIn:
    """A loopback vLLM 0.32: /health, /version, and a /metrics from a real capture whose generation counter
    grows on every scrape (so the engine shows progress), until a test breaks /metrics with a `Behaviour`."""

    def __init__(self, *, running: float = 8.0, progress: bool = True) -> None:
        self.server = LoopbackServer()
        self._lock = threading.Lock()
        self._scrapes = 0
        self._running = running
        self.progress = progress
        self.last_served = ""
        self.server.routes.update(
            {
                "/health": respond(200),
                "/version": respond(200, b'{"version":"0.32.0"}', "application/json"),
                "/metrics": self._metrics,
            }
        )

    @property
    def url(self) -> str:
        return self.server.url

    def body(self) -> str:
        with self._lock:
            self._scrapes += 1
            step = self._scrapes if self.progress else 0
            text = _GENERATION.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + 7 * step}", CAPTURE)
            text = _RUNNING.sub(lambda m: f"{m.group(1)} {self._running}", text)
            self.last_served = text
            return text

    def _metrics(self, conn: socket.socket) -> None:
        respond(200, self.body().encode(), "text/plain; version=0.0.4; charset=utf-8")(conn)

    def break_metrics(self, behaviour: Behaviour) -> None:
        self.server.routes["/metrics"] = behaviour

    def heal(self) -> None:
        self.server.routes["/metrics"] = self._metrics

    def set_health(self, status: int) -> None:
        self.server.routes["/health"] = respond(status)

    def close(self) -> None:
        self.server.close()


def read_events(log_path: Path) -> list[dict[str, object]]:
    """The daemon's JSON log lines (a line cut short by a kill -9 is skipped)."""
    events: list[dict[str, object]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def assert_survived(sidecar: SidecarProcess) -> None:
    """The daemon is still running and its log holds no traceback, no failed tick and no non-JSON line."""
    text = sidecar.log_path.read_text(errors="replace")
    assert sidecar.process.poll() is None, f"the sidecar exited with {sidecar.process.returncode}:\n{text[-3000:]}"
    assert_clean_log(sidecar.log_path)


def assert_clean_log(log_path: Path) -> None:
    text = log_path.read_text(errors="replace")
    assert "Traceback" not in text, f"the sidecar logged a traceback:\n{text[-4000:]}"
    stray = [line for line in text.splitlines() if line.strip() and not line.startswith("{")]
    assert stray == [], f"the sidecar wrote lines that are not JSON log events: {stray[:10]}"
    bad = [
        event
        for event in read_events(log_path)
        if event.get("event") == "tick_failed" or "exception" in event or event.get("level") == "critical"
    ]
    assert bad == [], f"the sidecar logged failures: {bad[:5]}"


def events_since(log_path: Path, offset: int) -> list[dict[str, object]]:
    """Events logged after the first `offset` events."""
    return read_events(log_path)[offset:]


def named(events: list[dict[str, object]], name: str) -> list[dict[str, object]]:
    return [event for event in events if event.get("event") == name]


def scrape(sidecar: SidecarProcess) -> Samples:
    return parse_samples(sidecar.get("/metrics").text)


def status(sidecar: SidecarProcess) -> dict[str, object]:
    document: dict[str, object] = sidecar.get("/status").json()
    return document


def policy(sidecar: SidecarProcess) -> dict[str, object]:
    found = status(sidecar)["policy"]
    assert isinstance(found, dict)
    return found


def engine_values_from_vllm(exposition: str, **labels: str) -> dict[str, float | None]:
    """What vLLM itself says about one engine (`ENGINE` unless given), read with prometheus_client: the values
    the sidecar must carry through."""
    engine = labels or ENGINE
    samples = parse_samples(exposition)
    blocks = block_size = None
    for name, pairs in samples:
        if name == "vllm:cache_config_info":
            found = dict(pairs)
            blocks, block_size = float(found["num_gpu_blocks"]), float(found["block_size"])
    return {
        "kv_cache_usage_ratio": value(samples, "vllm:kv_cache_usage_perc", **engine),
        "requests_running": value(samples, "vllm:num_requests_running", **engine),
        "requests_waiting": value(samples, "vllm:num_requests_waiting", **engine),
        "kv_cache_capacity_blocks": blocks,
        "kv_cache_block_size_tokens": block_size,
    }


def engine_values_from_sidecar(sidecar: SidecarProcess, **labels: str) -> dict[str, float | None]:
    """The same values as the sidecar exports them (/metrics) and reports them (/status)."""
    samples = scrape(sidecar)
    engines = status(sidecar).get("engines") or []
    assert isinstance(engines, list)
    engine: dict[str, object] = next((e for e in engines if all(e.get(k) == v for k, v in labels.items())), {})
    running, waiting = engine.get("requests_running"), engine.get("requests_waiting")
    return {
        "kv_cache_usage_ratio": value(samples, "vllm_sidecar_kv_cache_usage_ratio", **labels),
        "requests_running": float(running) if isinstance(running, int | float) else None,
        "requests_waiting": float(waiting) if isinstance(waiting, int | float) else None,
        "kv_cache_capacity_blocks": value(samples, "vllm_sidecar_kv_cache_capacity_blocks", **labels),
        "kv_cache_block_size_tokens": value(samples, "vllm_sidecar_kv_cache_block_size_tokens", **labels),
    }


@dataclass
class CounterWatch:
    """Scrapes the sidecar's /metrics every 0.25 s in a thread (bounded in time) and keeps every `_total`
    sample, so a test can prove the exported counters never went backwards while the fault lasted."""

    url: str
    max_seconds: float = 300.0
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = field(default_factory=dict)
    scrapes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CounterWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    samples = parse_samples(client.get(self.url + "/metrics").text)
                except (httpx.HTTPError, ValueError):
                    samples = {}
                for key, number in samples.items():
                    if key[0].endswith("_total"):
                        self.series.setdefault(key, []).append(number)
                self.scrapes += 1 if samples else 0
                self._stop.wait(0.25)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def assert_monotonic(self) -> None:
        assert self.scrapes >= 2, f"too few scrapes of the sidecar's /metrics: {self.scrapes}"
        back = {
            key: values
            for key, values in self.series.items()
            if any(later < earlier for earlier, later in itertools.pairwise(values))
        }
        assert back == {}, f"exported counters went backwards: {back}"


@contextmanager
def counter_watch(sidecar: SidecarProcess) -> Iterator[CounterWatch]:
    watch = CounterWatch(sidecar.url).start()
    try:
        yield watch
    finally:
        watch.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Load:
    """`clients` threads sending completions one after another (no model named: the server's own), errors
    ignored, until `stop()` or `max_seconds`. Each asks for `max_tokens`, so requests stay running a while."""

    url: str
    clients: int = 4
    max_tokens: int = 2000
    request_timeout_s: float = 60.0
    max_seconds: float = 240.0
    completed: int = 0
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        deadline = time.monotonic() + self.max_seconds
        for number in range(self.clients):
            thread = threading.Thread(target=self._run, args=(number, deadline), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, number: int, deadline: float) -> None:
        body = {"prompt": f"client {number} " + "word " * 40, "max_tokens": self.max_tokens, "ignore_eos": True}
        with httpx.Client(timeout=self.request_timeout_s) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    client.post(self.url + "/v1/completions", json=body).raise_for_status()
                    with self._lock:
                        self.completed += 1
                except httpx.HTTPError:
                    with self._lock:
                        self.errors += 1
                    self._stop.wait(0.2)

    def stop(self) -> None:
        """Send nothing new; a request hanging on a hung engine ends with its timeout (the threads are daemons)."""
        self._stop.set()


RESTART_SIM = Path(__file__).with_name("restart_sim.py")


class SimUnderExec:
    """The simulator, started and restarted by `restart_sim.py` (the exec adapter's command); `restarts()` is
    the witness of every restart that command performed."""

    def __init__(self, folder: Path, scenario: str, *overrides: str, delay_s: float = 0.0) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.delay_s = delay_s
        arguments = ["--listen", f"127.0.0.1:{self.port}", "--scenario", scenario, *overrides]
        (folder / "sim.json").write_text(json.dumps(arguments))
        subprocess.run([sys.executable, str(RESTART_SIM), str(folder), "--start"], check=True, timeout=30)
        wait_until(self.healthy, 20, "the simulator to answer /health", self.log_tail)

    @property
    def command(self) -> str:
        return shlex.join([sys.executable, str(RESTART_SIM), str(self.folder), "--delay-s", f"{self.delay_s:g}"])

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def restarts(self) -> list[str]:
        try:
            return (self.folder / "restarts.log").read_text().splitlines()
        except FileNotFoundError:
            return []

    def restarts_begun(self) -> list[str]:
        """The restart command's calls, each written when it starts (before its delay)."""
        try:
            return (self.folder / "begun.log").read_text().splitlines()
        except FileNotFoundError:
            return []

    def log_tail(self) -> str:
        try:
            return "\n--- simulator log ---\n" + "\n".join((self.folder / "sim.log").read_text().splitlines()[-20:])
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            pid = int((self.folder / "sim.pid").read_text())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # our own simulator (its pid file), never anything found by name


class ModuleSidecar(SidecarProcess):
    """A `SidecarProcess` started as `python -m MODULE *before run ...`: a wrapper that swaps in a fake driver."""

    def __init__(
        self, module: str, before: list[str], args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        full_env = {**os.environ, **(env or {})}
        full_env.pop("VLLM_SIDECAR_CONFIG", None)
        listen = ["--listen", f"127.0.0.1:{self.port}", "--log-format", "json"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *before, "run", *listen, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
