"""Runs one load test: the probe, the arrivals, the bounds, and the /metrics polling beside them. Does
network I/O; the clock is injectable.

Open loop (`--rate`): Poisson arrivals from a seeded generator, each sent on time whatever the server is
doing; an arrival that finds `--max-in-flight` requests running is recorded as dropped by the client, never
queued. Closed loop (`--concurrency N`): N workers, each sending its next request when its last one ended.
Sending stops at `--duration` or `--max-requests`, or as soon as the server refuses a connection (it is not
listening: more requests would only add failures, and a closed loop would spin); the requests still
running then end by their own deadline (`--timeout`), so the whole run is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from sidecar.loadtest.client import ClientShards, Target, send
from sidecar.loadtest.gate import ReadinessGate
from sidecar.loadtest.metrics import ServerWatch
from sidecar.loadtest.monitor import PROBE_TIMEOUT_S, Monitor, ServerInfo, probe
from sidecar.loadtest.result import FailureKind, RequestResult, dropped, not_ready
from sidecar.loadtest.spec import MAX_REQUESTS, LoadSpec, PlannedRequest, check_fits, plan_request, seeded

PROGRESS_INTERVAL_S = 0.25
DRAIN_GRACE_S = 5.0  # beyond --timeout, for a request whose own deadline somehow did not end it
POOL_SLACK = 16  # connections beyond the in-flight cap, since a finished request frees its slot a tick later
_Sender = Callable[[PlannedRequest], Coroutine[Any, Any, RequestResult]]
_DOWN_KINDS = {FailureKind.CONNECTION_REFUSED: "connection refused", FailureKind.CONNECTION_RESET: "connection reset"}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunProgress:
    elapsed_s: float
    sent: int
    ok: int
    failed: int
    in_flight: int
    sending_fraction: float  # how far sending is towards its bound (duration or count), 0 to 1
    sending: bool


class ProgressSink(Protocol):
    def update(self, progress: RunProgress) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    info: ServerInfo
    results: tuple[RequestResult, ...]  # by request index
    sending_s: float  # open loop: from the start until sending stopped; closed loop: the whole run
    max_send_lag_s: float | None  # open loop: the most an arrival was sent after its time (a busy client)
    duration_s: float  # from the start until the last request ended
    watch: ServerWatch
    stopped_early: bool  # sending stopped before its bound: the server refused a connection


@dataclass(slots=True)
class _Tally:
    spec: LoadSpec
    watch: ServerWatch
    results: list[RequestResult] = field(default_factory=list)
    sent: int = 0
    ok: int = 0
    dropped: int = 0
    max_send_lag_s: float | None = None
    in_flight: int = 0
    sending: bool = True
    refused: bool = False  # a connection was refused: send nothing more

    def record(self, result: RequestResult) -> None:
        self.results.append(result)
        if result.ok:
            self.ok += 1
        elif result.failure is FailureKind.DROPPED_BY_CLIENT:
            self.dropped += 1
        elif result.failure is FailureKind.CONNECTION_REFUSED:
            self.refused = True
        reason = _DOWN_KINDS.get(result.failure) if result.failure is not None else None
        if reason is not None:
            self.watch.observe_down(result.finished_s, reason)

    def progress(self, elapsed_s: float) -> RunProgress:
        fractions = [0.0]
        if self.spec.duration_s is not None:
            fractions.append(elapsed_s / self.spec.duration_s)
        if self.spec.max_requests is not None:
            fractions.append((self.sent + self.dropped) / self.spec.max_requests)
        return RunProgress(
            elapsed_s=elapsed_s,
            sent=self.sent,
            ok=self.ok,
            failed=len(self.results) - self.ok,
            in_flight=self.in_flight,
            sending_fraction=min(1.0, max(fractions)) if self.sending else 1.0,
            sending=self.sending,
        )


GATE_BACKOFF_S = 0.1  # how long a worker waits after its request met a closed readiness gate


def _watch_client() -> httpx.AsyncClient:
    # A fresh connection for every poll. The polls are a second apart, more on a busy client: a kept-alive
    # connection can reach the server's idle close (vLLM's 5 s) as a poll reuses it, and the poll then reads
    # "server disconnected", which is the sign of a dead server (CI 2026-11-30: a live server judged dead).
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=0)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(PROBE_TIMEOUT_S), limits=limits, follow_redirects=False, trust_env=False
    )


async def run_load(
    spec: LoadSpec, *, sink: ProgressSink | None = None, clock: Callable[[], float] = time.monotonic
) -> RunOutcome:
    """Probe the server (UnreachableError, SpecError), run the load, watch the server; never retries."""
    watch = ServerWatch()
    connections = (spec.concurrency or spec.max_in_flight) + POOL_SLACK
    async with (
        ClientShards(connections=connections, timeout_s=spec.timeout_s) as shards,
        _watch_client() as watch_client,
    ):
        info = await probe(watch_client, spec, watch)
        if info.max_model_len is not None:
            check_fits(spec, info.max_model_len)
        target = Target(
            base_url=spec.url, api=spec.api, model=info.model, timeout_s=spec.timeout_s, api_key=spec.api_key
        )
        started = clock()
        tally = _Tally(spec=spec, watch=watch)
        monitor = Monitor(
            client=watch_client, base_url=spec.url, info=info, watch=watch, run_started=started, clock=clock
        )
        stop = asyncio.Event()
        background = [asyncio.create_task(monitor.poll_until(stop))]
        gate = ReadinessGate(spec.readiness_url, watch_client) if spec.readiness_url is not None else None
        if gate is not None:
            await gate.check()
            background.append(asyncio.create_task(gate.poll_until(stop)))
        if sink is not None:
            background.append(asyncio.create_task(_show_progress(sink, tally, stop, started, clock)))

        async def send_one(planned: PlannedRequest) -> RequestResult:
            if gate is not None and not gate.open:
                held = not_ready(planned, clock() - started, gate.url)
                tally.record(held)
                await asyncio.sleep(GATE_BACKOFF_S)  # a closed loop would otherwise spin on the closed gate
                return held
            tally.sent += 1
            tally.in_flight += 1
            try:
                async with shards.lease() as client:
                    result = await send(client, target, planned, run_started=started, clock=clock)
            finally:
                tally.in_flight -= 1
            tally.record(result)
            return result

        try:
            if spec.rate_per_s is not None:
                sending_s = await _open_loop(
                    spec, spec.rate_per_s, send_one=send_one, tally=tally, started=started, clock=clock
                )
            else:
                sending_s = await _closed_loop(
                    spec, spec.concurrency or 1, send_one=send_one, tally=tally, started=started, clock=clock
                )
            tally.sending = False
            duration_s = clock() - started
        finally:
            stop.set()
            await asyncio.gather(*background)
        await monitor.final_check()
    return RunOutcome(
        info=info,
        results=tuple(sorted(tally.results, key=lambda result: result.index)),
        sending_s=sending_s,
        max_send_lag_s=tally.max_send_lag_s,
        duration_s=duration_s,
        watch=watch,
        stopped_early=tally.refused,
    )


async def _open_loop(
    spec: LoadSpec,
    rate_per_s: float,
    *,
    send_one: _Sender,
    tally: _Tally,
    started: float,
    clock: Callable[[], float],
) -> float:
    """Send on a Poisson schedule until a bound; wait for what is in flight; return when sending stopped."""
    arrivals = seeded(f"{spec.seed}/arrivals")
    running: dict[asyncio.Task[RequestResult], PlannedRequest] = {}
    next_at = 0.0
    for index in range(spec.max_requests or MAX_REQUESTS):
        if spec.duration_s is not None and next_at >= spec.duration_s:
            break
        delay = started + next_at - clock()
        # Behind schedule, send at once, but let the running requests read their answers in between.
        await asyncio.sleep(max(0.0, delay))
        if tally.refused:
            break
        lag = clock() - started - next_at
        tally.max_send_lag_s = max(lag, tally.max_send_lag_s or 0.0)
        planned = plan_request(spec, index)
        if len(running) >= spec.max_in_flight:
            tally.record(dropped(planned, clock() - started, spec.max_in_flight))
        else:
            task = asyncio.create_task(send_one(planned))
            running[task] = planned
            task.add_done_callback(running.pop)
        next_at += arrivals.expovariate(rate_per_s)
    # Sending lasts until the next arrival would have been due (or the duration ends), so N arrivals span
    # N gaps and the rate achieved reads true.
    window_end = next_at if spec.duration_s is None else min(next_at, spec.duration_s)
    if not tally.refused:
        await asyncio.sleep(max(0.0, started + window_end - clock()))
    sending_s = clock() - started
    tally.sending = False
    if running:
        _, pending = await asyncio.wait(set(running), timeout=spec.timeout_s + DRAIN_GRACE_S)
        for task in pending:
            planned = running[task]
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            tally.record(_late(planned, clock() - started, spec.timeout_s))
    return sending_s


async def _closed_loop(
    spec: LoadSpec,
    workers: int,
    *,
    send_one: _Sender,
    tally: _Tally,
    started: float,
    clock: Callable[[], float],
) -> float:
    """N workers back to back until a bound; the sending window of a closed loop is the whole run."""
    indices = iter(range(spec.max_requests or MAX_REQUESTS))  # shared: each index is sent once

    async def worker() -> None:
        for index in indices:
            if tally.refused or (spec.duration_s is not None and clock() - started >= spec.duration_s):
                return
            await send_one(plan_request(spec, index))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return clock() - started


def _late(planned: PlannedRequest, at_s: float, timeout_s: float) -> RequestResult:
    return RequestResult(
        index=planned.index,
        started_s=at_s - timeout_s,
        duration_s=timeout_s,
        requested_prompt_tokens=planned.prompt_words,
        requested_output_tokens=planned.max_tokens,
        failure=FailureKind.TIMEOUT,
        error=f"still running {DRAIN_GRACE_S:g} s after its {timeout_s:g} s deadline; cancelled",
    )


async def _show_progress(
    sink: ProgressSink, tally: _Tally, stop: asyncio.Event, started: float, clock: Callable[[], float]
) -> None:
    while not stop.is_set():  # bounded: stop is set when the bounded run ends
        sink.update(tally.progress(clock() - started))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PROGRESS_INTERVAL_S):
                await stop.wait()
    sink.update(tally.progress(clock() - started))
