"""The demo's traffic: a few workers sending completions the way a router would. Does network I/O.

Like a router or a Kubernetes Service, it sends only while the sidecar's /readyz says 200, so when the
policy pauses admission the demo's load really stops (the vLLM without a sidecar gets its load unasked). Each
scenario's load is the one its preset was calibrated against (`sidecar.sim.scenarios.scenario_load`:
concurrency over time, prompt and output lengths, shared prefixes); where a scenario shares no prefix, half the
prompts share one of a few, so the prefix cache has something to hit.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field, replace

import httpx

from sidecar.sim.scenarios import LoadShape as Schedule
from sidecar.sim.scenarios import scenario_load

SHARED_PREFIX_TOKENS = 256


@dataclass(slots=True)
class LoadCounters:
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    refused: int = 0  # of the failed: nothing listening (vLLM down or starting again)
    interrupted: int = 0  # in flight when the demo stopped: cut off by the stop, not failed by vLLM
    held_by_readiness: int = 0
    last_error: str = ""
    by_status: dict[str, int] = field(default_factory=dict)
    started_s: dict[int, float] = field(default_factory=dict)  # each request in flight: when it was sent

    @property
    def in_flight(self) -> int:
        return self.sent - self.succeeded - self.failed - self.interrupted

    def oldest_in_flight_s(self, now_s: float) -> float | None:
        """How long the oldest request in flight has waited (a hung vLLM answers none); None: none in flight."""
        return now_s - min(self.started_s.values()) if self.started_s else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadShape:
    schedule: Schedule = field(default_factory=lambda: Schedule(concurrency=24))  # requests in flight over time
    prompt_tokens: tuple[int, int] = (400, 1600)
    output_tokens: tuple[int, int] = (64, 256)
    shared_prefix_tokens: int = SHARED_PREFIX_TOKENS
    shared_prefixes: int = 4
    shared_share: float = 0.5
    seed: int = 7

    @property
    def concurrency(self) -> int:
        return self.schedule.concurrency

    @classmethod
    def for_scenario(cls, name: str, concurrency: int | None = None) -> LoadShape:
        """Scenario `name`'s calibrated load; `concurrency` replaces its (largest) concurrency."""
        schedule = scenario_load(name)
        if concurrency is not None:
            start = schedule.concurrency_start
            schedule = replace(
                schedule, concurrency=concurrency, concurrency_start=None if start is None else min(start, concurrency)
            )
        jitter = schedule.prompt_jitter_tokens
        prompt = (schedule.prompt_tokens - jitter, schedule.prompt_tokens + jitter)
        output = (schedule.max_tokens, schedule.max_tokens)
        if schedule.prefix_groups:
            return cls(
                schedule=schedule,
                prompt_tokens=prompt,
                output_tokens=output,
                shared_prefix_tokens=schedule.prefix_tokens,
                shared_prefixes=schedule.prefix_groups,
                shared_share=1.0,
            )
        shared = min(SHARED_PREFIX_TOKENS, prompt[0] // 2)
        return cls(schedule=schedule, prompt_tokens=prompt, output_tokens=output, shared_prefix_tokens=shared)


def _prompt(rng: random.Random, shape: LoadShape, serial: int) -> str:
    length = rng.randint(*shape.prompt_tokens)
    if rng.random() < shape.shared_share:
        prefix_id = rng.randrange(shape.shared_prefixes)
        prefix = [f"shared{prefix_id}w{i}" for i in range(shape.shared_prefix_tokens)]
        rest = [f"r{serial}w{i}" for i in range(max(1, length - len(prefix)))]
        return " ".join(prefix + rest)
    return " ".join(f"u{serial}w{i}" for i in range(length))


async def drive(
    *,
    vllm_url: str,
    readiness_url: str | None,
    model: str,
    shape: LoadShape,
    counters: LoadCounters,
    stop: asyncio.Event,
) -> None:
    """Run the shape's workers until `stop` is set; worker i sends while the schedule wants more than i (and
    `readiness_url`, if any, answers 200). A request the stop cuts off counts as interrupted, not failed."""
    rng = random.Random(shape.seed)  # noqa: S311 - load shapes, not secrets
    serials = itertools.count()
    began = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=2.0)) as client:

        async def worker(index: int) -> None:
            while not stop.is_set():
                if index >= shape.schedule.concurrency_at(time.monotonic() - began):
                    await _pause(stop, 0.25)  # not wanted yet (a ramp) or now (a quiet spell)
                    continue
                if readiness_url is not None and not await _admitting(client, readiness_url):
                    counters.held_by_readiness += 1
                    await _pause(stop, 0.5)
                    continue
                serial = next(serials)
                body = {
                    "model": model,
                    "prompt": _prompt(rng, shape, serial),
                    "max_tokens": rng.randint(*shape.output_tokens),
                    "ignore_eos": True,
                }
                counters.sent += 1
                counters.started_s[serial] = time.monotonic()
                try:
                    response = await client.post(vllm_url + "/v1/completions", json=body)
                except asyncio.CancelledError:
                    counters.interrupted += 1  # the demo is stopping: it cut the request off
                    raise
                except httpx.HTTPError as error:
                    if stop.is_set():  # the server went down with the demo's stop
                        counters.interrupted += 1
                        continue
                    counters.failed += 1
                    counters.refused += isinstance(error, httpx.ConnectError)
                    counters.last_error = type(error).__name__
                    await _pause(stop, 1.0)  # vLLM is down or restarting: don't spin
                    continue
                finally:
                    counters.started_s.pop(serial, None)
                key = str(response.status_code)
                counters.by_status[key] = counters.by_status.get(key, 0) + 1
                if stop.is_set() and response.status_code != httpx.codes.OK:
                    counters.interrupted += 1  # answered with the server's shutdown
                elif response.status_code == httpx.codes.OK:
                    counters.succeeded += 1
                else:
                    counters.failed += 1
                    counters.last_error = f"HTTP {response.status_code}"
                    await _pause(stop, 0.5)

        workers = [asyncio.create_task(worker(index)) for index in range(shape.concurrency)]
        await stop.wait()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def _admitting(client: httpx.AsyncClient, readiness_url: str) -> bool:
    try:
        return (await client.get(readiness_url, timeout=2.0)).status_code == httpx.codes.OK
    except httpx.HTTPError:
        return True  # no sidecar answer: a router would fall back to vLLM's own health; keep sending


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return
