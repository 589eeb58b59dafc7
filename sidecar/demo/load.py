"""The demo's traffic: a few workers sending completions the way a router would. Does network I/O.

Like a router or a Kubernetes Service, it sends only while the sidecar's /readyz says 200, so when the
policy pauses admission the demo's load really stops. Half the prompts share one of a few prefixes so
the prefix cache has something to hit.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field

import httpx


@dataclass(slots=True)
class LoadCounters:
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    held_by_readiness: int = 0
    last_error: str = ""
    by_status: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadShape:
    concurrency: int = 24
    prompt_tokens: tuple[int, int] = (400, 1600)
    output_tokens: tuple[int, int] = (64, 256)
    shared_prefix_tokens: int = 256
    shared_prefixes: int = 4
    shared_share: float = 0.5
    seed: int = 7


def _prompt(rng: random.Random, shape: LoadShape, serial: int) -> str:
    length = rng.randint(*shape.prompt_tokens)
    if rng.random() < shape.shared_share:
        prefix_id = rng.randrange(shape.shared_prefixes)
        prefix = [f"shared{prefix_id}w{i}" for i in range(shape.shared_prefix_tokens)]
        rest = [f"r{serial}w{i}" for i in range(max(1, length - len(prefix)))]
        return " ".join(prefix + rest)
    return " ".join(f"u{serial}w{i}" for i in range(length))


async def drive(
    *, vllm_url: str, readiness_url: str, model: str, shape: LoadShape, counters: LoadCounters, stop: asyncio.Event
) -> None:
    """Run `shape.concurrency` workers until `stop` is set."""
    rng = random.Random(shape.seed)  # noqa: S311 - load shapes, not secrets
    serials = itertools.count()
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=2.0)) as client:

        async def worker() -> None:
            while not stop.is_set():
                if not await _admitting(client, readiness_url):
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
                try:
                    response = await client.post(vllm_url + "/v1/completions", json=body)
                except httpx.HTTPError as error:
                    counters.failed += 1
                    counters.last_error = type(error).__name__
                    await _pause(stop, 1.0)  # vLLM is down or restarting: don't spin
                    continue
                key = str(response.status_code)
                counters.by_status[key] = counters.by_status.get(key, 0) + 1
                if response.status_code == httpx.codes.OK:
                    counters.succeeded += 1
                else:
                    counters.failed += 1
                    counters.last_error = f"HTTP {response.status_code}"
                    await _pause(stop, 0.5)

        workers = [asyncio.create_task(worker()) for _ in range(shape.concurrency)]
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
