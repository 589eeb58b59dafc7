"""Drive real load through a vLLM server and watch its own ``/metrics`` while doing so (stdlib only).

:func:`drive_standard_load` is the scenario the end-to-end tests share. With the flags of ``server.py``
(128 KV blocks of 32 tokens, ``--max-num-seqs 8``) it makes every metric the sidecar cares about move:

* phase A: one ~300-token prompt whose first ~290 tokens are a shared prefix, then a second one with the
  same prefix (prefix-cache hits), then 4 concurrent ones with that prefix; ``max_tokens`` 16 each;
* phase B: 12 concurrent distinct ~114-token prompts x 300 generated tokens: 8 run (the limit), 4 wait,
  and KV-cache usage climbs to about 0.7-0.8 as decoding allocates blocks. Rounds of it repeat (new
  prompts each time, so no prefix hits) until phase B has lasted ``min_phase_b_seconds``.

A background thread scrapes ``/metrics`` every 0.25 s and keeps the peaks; a caller's ``on_poll``
callback sees every scrape, so a test can query the sidecar while vLLM is under load.

Every loop here is bounded in count and in time, and only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

MODEL_NAME = "tiny-llama"
ALLOWED_HOSTS = frozenset({"127.0.0.1"})
REQUEST_TIMEOUT_S = 300.0
SCRAPE_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.25
MAX_POLL_SECONDS = 900.0
MAX_CONSECUTIVE_SCRAPE_ERRORS = 40  # 10 s of a dead /metrics at 0.25 s

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PEAK_METRICS: tuple[str, ...] = (KV_CACHE_USAGE, RUNNING, WAITING)
WATCHED_METRICS: tuple[str, ...] = (*PEAK_METRICS, PREFIX_QUERIES, PREFIX_HITS, PREEMPTIONS)

# Prompt text made of the sentences the tiny tokenizer was trained on (about 49 tokens per copy).
BASE_TEXT = (
    "You are a helpful assistant. Answer the question concisely. The quick brown fox jumps over the lazy "
    "dog. vLLM is a high-throughput and memory-efficient inference engine. Prometheus scrapes metrics such "
    "as kv cache usage and running requests. "
)
SHARED_PREFIX = BASE_TEXT * 6  # about 294 tokens: 9 full blocks of 32 can be reused
PHASE_A_MAX_TOKENS = 16
PHASE_A_CONCURRENT = 4
PHASE_B_REQUESTS = 12
PHASE_B_MAX_TOKENS = 300
# One phase-B round lasts about 1 s on a quiet 2-core box (5-40 s on a busy one): too short for a 0.25 s
# poller to be sure to catch the peak, or for a sidecar to scrape it. So phase B repeats, with fresh prompts,
# until it has lasted this long, at most MAX_PHASE_B_ROUNDS times.
MIN_PHASE_B_SECONDS = 3.0
MAX_PHASE_B_ROUNDS = 50

PollCallback = Callable[[dict[str, float]], None]

_SAMPLE_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def check_local(base_url: str) -> str:
    """Return ``base_url`` without a trailing slash; refuse anything but http on 127.0.0.1."""
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme != "http" or parsed.hostname not in ALLOWED_HOSTS:
        raise ValueError(f"load driver only talks to http://127.0.0.1, not {base_url!r}")
    return base_url.rstrip("/")


def _open(request: urllib.request.Request | str, timeout: float) -> bytes:
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    check_local(url)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (checked: http, loopback)
        body: bytes = response.read()
        return body


# --------------------------------------------------------------------------------------------- metrics text


def fetch_metrics(base_url: str, timeout: float = SCRAPE_TIMEOUT_S) -> str:
    """GET ``/metrics`` and return the Prometheus text."""
    return _open(f"{check_local(base_url)}/metrics", timeout).decode("utf-8")


def iter_samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """Yield ``(name, labels, value)`` for each sample line of Prometheus text (comments skipped)."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_LINE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        yield match["name"], labels, value


def parse_metrics(text: str, names: Sequence[str] = WATCHED_METRICS) -> dict[str, float]:
    """Values of ``names`` in ``text``, summed over label sets (one engine here, so one series each).

    Names absent from the text are absent from the result. Matching is on the exact sample name, so
    ``vllm:num_requests_waiting`` does not pick up ``vllm:num_requests_waiting_by_reason``.
    """
    wanted = set(names)
    values: dict[str, float] = {}
    for name, _, value in iter_samples(text):
        if name in wanted:
            values[name] = values.get(name, 0.0) + value
    return values


def metric_labels(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of every sample named ``name`` (e.g. ``vllm:cache_config_info``, whose value is 1)."""
    return [labels for sample_name, labels, _ in iter_samples(text) if sample_name == name]


# ------------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class Completion:
    """The parts of a ``/v1/completions`` answer the tests use."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def complete(base_url: str, prompt: str, max_tokens: int, *, timeout: float = REQUEST_TIMEOUT_S) -> Completion:
    """One greedy ``/v1/completions`` request generating exactly ``max_tokens`` tokens (``ignore_eos``)."""
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode("utf-8")
    request = urllib.request.Request(  # noqa: S310 (checked: http, loopback)
        f"{check_local(base_url)}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    started = time.monotonic()
    answer = json.loads(_open(request, timeout))
    usage = answer["usage"]
    return Completion(
        text=str(answer["choices"][0]["text"]),
        prompt_tokens=int(usage["prompt_tokens"]),
        completion_tokens=int(usage["completion_tokens"]),
        seconds=time.monotonic() - started,
    )


def run_concurrently(
    base_url: str, prompts: Sequence[str], max_tokens: int, *, timeout: float = REQUEST_TIMEOUT_S
) -> list[Completion]:
    """Send all ``prompts`` at once, one thread each; return the answers in prompt order.

    Each request is bounded by ``timeout``, and so is the whole batch. The first error is re-raised once
    every request has finished or the batch deadline has passed.
    """
    if not prompts:
        return []
    with ThreadPoolExecutor(max_workers=len(prompts), thread_name_prefix="vllm-load") as pool:
        futures = [pool.submit(complete, base_url, p, max_tokens, timeout=timeout) for p in prompts]
        _, not_done = wait(futures, timeout=timeout + 5.0)
        if not_done:
            raise TimeoutError(f"{len(not_done)} of {len(prompts)} requests still running after {timeout} s")
        return [f.result() for f in futures]


# ------------------------------------------------------------------------------------------------- poller


@dataclass
class MetricsPoller:
    """Background thread that scrapes ``/metrics`` every ``interval`` seconds and records peaks.

    ``on_poll`` runs in the poller thread after every successful scrape with the parsed values of
    :data:`WATCHED_METRICS`; keep it short (a slow callback delays the next scrape). An exception it raises
    stops the callbacks (not the polling) and is re-raised by :meth:`stop`.
    """

    base_url: str
    interval: float = POLL_INTERVAL_S
    on_poll: PollCallback | None = None
    max_seconds: float = MAX_POLL_SECONDS
    peaks: dict[str, float] = field(default_factory=dict, init=False)
    last: dict[str, float] = field(default_factory=dict, init=False)
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list, init=False, repr=False)
    polls: int = field(default=0, init=False)
    scrape_errors: int = field(default=0, init=False)
    peak_text: str = field(default="", init=False, repr=False)
    _peak_key: tuple[float, float] = field(default=(-1.0, -1.0), init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _started: float = field(default=0.0, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _callback_error: BaseException | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        """Start polling (once)."""
        check_local(self.base_url)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="vllm-metrics-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling, wait for the thread, and re-raise an ``on_poll`` exception if there was one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SCRAPE_TIMEOUT_S + self.interval + 5.0)
        if self._callback_error is not None:
            raise self._callback_error

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        consecutive_errors = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                text = fetch_metrics(self.base_url)
            except (urllib.error.URLError, OSError):
                self.scrape_errors += 1
                consecutive_errors += 1
                if consecutive_errors >= MAX_CONSECUTIVE_SCRAPE_ERRORS:
                    return
            else:
                consecutive_errors = 0
                self._record(text)
            self._stop.wait(self.interval)

    def _record(self, text: str) -> None:
        values = parse_metrics(text)
        self.polls += 1
        self.last = values
        self.timeline.append((round(time.monotonic() - self._started, 3), values))
        for name in PEAK_METRICS:
            if name in values:
                self.peaks[name] = max(self.peaks.get(name, -math.inf), values[name])
        key = (values.get(RUNNING, 0.0), values.get(KV_CACHE_USAGE, 0.0))
        if key > self._peak_key:
            self._peak_key, self.peak_text = key, text
        if self.on_poll is not None and self._callback_error is None:
            try:
                self.on_poll(values)
            except BaseException as error:  # handed to the caller's thread by stop()
                self._callback_error = error


# ----------------------------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class LoadReport:
    """What :func:`drive_standard_load` saw. Counter values are the server's totals at the end (cumulative
    since the server started), not deltas; ``*_before`` give the starting point."""

    peak_kv_cache_usage: float
    peak_running: float
    peak_waiting: float
    prefix_cache_queries: float
    prefix_cache_hits: float
    prefix_cache_queries_before: float
    prefix_cache_hits_before: float
    preemptions: float
    polls: int
    scrape_errors: int
    timeline: tuple[tuple[float, dict[str, float]], ...]  # (seconds since start, watched values) per scrape
    phase_a_seconds: float
    phase_b_seconds: float
    phase_b_rounds: int
    phase_a: tuple[Completion, ...]
    phase_b: tuple[Completion, ...]
    peak_metrics_text: str  # the scrape with the most running requests (ties: highest KV usage)
    final_metrics_text: str  # a scrape taken after every request had finished


def phase_a_prompts() -> list[str]:
    """Shared-prefix prompts: two sequential ones, then :data:`PHASE_A_CONCURRENT` concurrent ones."""
    return [SHARED_PREFIX + f"Question {i}: hello world {i}?" for i in range(2 + PHASE_A_CONCURRENT)]


def phase_b_prompts(round_index: int = 0) -> list[str]:
    """Distinct prompts of about 114 tokens each: their first block differs from every other prompt's,
    in this round and in the others, so they get no prefix-cache hits."""
    return [f"{round_index}-{i} {i} {i} request number {i}. " + BASE_TEXT * 2 for i in range(PHASE_B_REQUESTS)]


def drive_standard_load(
    base_url: str,
    on_poll: PollCallback | None = None,
    *,
    interval: float = POLL_INTERVAL_S,
    timeout: float = REQUEST_TIMEOUT_S,
    min_phase_b_seconds: float = MIN_PHASE_B_SECONDS,
    max_phase_b_rounds: int = MAX_PHASE_B_ROUNDS,
    until: Callable[[], bool] | None = None,
) -> LoadReport:
    """Run phases A and B against ``base_url`` while polling its ``/metrics``; see the module docstring.

    ``on_poll`` is called (in the poller thread) with the parsed watched metrics after every scrape; it can
    check e.g. ``values[RUNNING] >= 8`` to act while vLLM is fully loaded. Its exception, if any, is
    re-raised here after the load has finished. Phase B runs at least once and then repeats until it has
    lasted ``min_phase_b_seconds`` and ``until()`` (checked between rounds) is true, at most
    ``max_phase_b_rounds`` rounds: a sidecar scraping on its own clock may need more than one round to
    catch the peak, and ``until`` lets its test say when it has (and fail, not hang, when it never does).
    """
    base_url = check_local(base_url)
    before = parse_metrics(fetch_metrics(base_url))
    poller = MetricsPoller(base_url, interval=interval, on_poll=on_poll)
    poller.start()
    try:
        started = time.monotonic()
        prompts_a = phase_a_prompts()
        phase_a = [complete(base_url, prompts_a[0], PHASE_A_MAX_TOKENS, timeout=timeout)]
        phase_a.append(complete(base_url, prompts_a[1], PHASE_A_MAX_TOKENS, timeout=timeout))
        phase_a += run_concurrently(base_url, prompts_a[2:], PHASE_A_MAX_TOKENS, timeout=timeout)
        phase_a_seconds = time.monotonic() - started

        started = time.monotonic()
        phase_b: list[Completion] = []
        rounds = 0
        while rounds < max(1, max_phase_b_rounds) and (
            rounds == 0 or time.monotonic() - started < min_phase_b_seconds or (until is not None and not until())
        ):
            prompts_b = phase_b_prompts(rounds)
            phase_b += run_concurrently(base_url, prompts_b, PHASE_B_MAX_TOKENS, timeout=timeout)
            rounds += 1
        phase_b_seconds = time.monotonic() - started
        time.sleep(2 * interval)  # let the poller see the idle state once
    finally:
        poller.stop()

    final_text = fetch_metrics(base_url)
    final = parse_metrics(final_text)
    return LoadReport(
        peak_kv_cache_usage=poller.peaks.get(KV_CACHE_USAGE, 0.0),
        peak_running=poller.peaks.get(RUNNING, 0.0),
        peak_waiting=poller.peaks.get(WAITING, 0.0),
        prefix_cache_queries=final.get(PREFIX_QUERIES, 0.0),
        prefix_cache_hits=final.get(PREFIX_HITS, 0.0),
        prefix_cache_queries_before=before.get(PREFIX_QUERIES, 0.0),
        prefix_cache_hits_before=before.get(PREFIX_HITS, 0.0),
        preemptions=final.get(PREEMPTIONS, 0.0),
        polls=poller.polls,
        timeline=tuple(poller.timeline),
        scrape_errors=poller.scrape_errors,
        phase_a_seconds=phase_a_seconds,
        phase_b_seconds=phase_b_seconds,
        phase_b_rounds=rounds,
        phase_a=tuple(phase_a),
        phase_b=tuple(phase_b),
        peak_metrics_text=poller.peak_text,
        final_metrics_text=final_text,
    )
