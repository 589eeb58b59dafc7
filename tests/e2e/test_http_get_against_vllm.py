"""The small HTTP client (sidecar.sources.http_get) against a real vLLM 0.32 on CPU (uvicorn, prometheus_client).

It must read what httpx reads: /metrics, /health and /version, over one kept-alive connection, and the vLLM
source must turn both into the same reading.
"""

from __future__ import annotations

import httpx
import pytest

from sidecar.parse.exposition import parse_exposition
from sidecar.sources.fetch import HttpxFetcher, PlainHttpFetcher
from sidecar.sources.http_get import HttpGetClient
from sidecar.sources.vllm_http import VllmHttpSource

from .vllm.server import VllmServer

pytestmark = pytest.mark.e2e


def _kept(text: str) -> dict[str, list[tuple[object, float]]]:
    """Every sample, including the counters vLLM moves on its own between two reads, minus those."""
    moving = ("_created", "process_", "python_gc", "http_")
    return {
        name: [(sample.labels, sample.value) for sample in samples]
        for name, samples in parse_exposition(text).samples.items()
        if not any(part in name for part in moving)
    }


async def test_reads_what_httpx_reads_over_one_connection(vllm_server: VllmServer) -> None:
    client = HttpGetClient()
    try:
        answers = [await client.get(vllm_server.base_url + "/metrics", max_bytes=16 * 2**20) for _ in range(3)]
        health = await client.get(vllm_server.base_url + "/health", max_bytes=65536)
        version = await client.get(vllm_server.base_url + "/version", max_bytes=65536)
        idle = sum(len(connections) for connections in client._idle.values())
    finally:
        await client.aclose()
    assert all(answer.status == 200 for answer in answers)
    assert health.status == 200
    assert b'"version"' in version.body
    assert idle == 1  # five requests, one keep-alive connection
    async with httpx.AsyncClient(timeout=10) as reference:
        through_httpx = await reference.get(vllm_server.base_url + "/metrics")
    assert _kept(answers[-1].body.decode()) == _kept(through_httpx.text)


async def test_the_source_reads_the_same_through_both_clients(vllm_server: VllmServer) -> None:
    small = HttpGetClient()
    try:
        async with httpx.AsyncClient(timeout=10) as shared:
            through_httpx = await VllmHttpSource(
                fetcher=HttpxFetcher(shared), base_url=vllm_server.base_url, timeout_s=10, max_body_bytes=16 * 2**20
            ).read()
            through_small = await VllmHttpSource(
                fetcher=PlainHttpFetcher(small), base_url=vllm_server.base_url, timeout_s=10, max_body_bytes=16 * 2**20
            ).read()
    finally:
        await small.aclose()
    assert through_small.ok, through_small.error
    assert through_httpx.value is not None
    assert through_small.value is not None
    assert (through_small.value.version, through_small.value.schema) == (
        through_httpx.value.version,
        through_httpx.value.schema,
    )
    assert through_small.value.problems == through_httpx.value.problems
    # At rest (nothing else runs in this test) the engines' readings are the same numbers.
    assert through_small.value.engines == through_httpx.value.engines
