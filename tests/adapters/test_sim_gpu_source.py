"""The simulated-GPU source against loopback servers answering good and malformed /sim/gpu documents."""

from __future__ import annotations

import json

import httpx
import pytest

from sidecar.model.gpu import ProcessOwner
from sidecar.sources.fetch import BodyFetcher, HttpxFetcher
from sidecar.sources.sim_gpu import SimGpuSource
from tests.loopback import LoopbackServer, closed_port, respond, slow


@pytest.fixture
def fetcher(client: httpx.AsyncClient) -> BodyFetcher:
    """httpx's; tests/adapters/test_http_get.py runs these scenarios again with the own client's."""
    return HttpxFetcher(client)


GPU = {
    "index": 0,
    "uuid": "GPU-sim-0",
    "name": "Simulated H100 80GB",
    "total_bytes": 80 * 2**30,
    "used_bytes": 70 * 2**30,
    "utilization_ratio": 0.6,
    "temperature_celsius": 61,
    "processes": [
        {"pid": 4242, "name": "VLLM::EngineCore", "used_bytes": 66 * 2**30},
        {"pid": 5000, "name": "python train.py", "used_bytes": 4 * 2**30},
    ],
}


def _source(fetcher: BodyFetcher, url: str, timeout_s: float = 10.0, **kwargs: object) -> SimGpuSource:
    # 10 s: a read that must succeed has room on a busy 2-core box; the timeout's own test passes 0.5 s.
    return SimGpuSource(fetcher=fetcher, url=url + "/sim/gpu", timeout_s=timeout_s, **kwargs)  # type: ignore[arg-type]


async def test_reads_devices_and_classifies_owners(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    server.routes["/sim/gpu"] = respond(body=json.dumps({"gpus": [GPU, {**GPU, "index": 1}]}).encode())
    result = await _source(fetcher, server.url).read()
    assert result.ok, result.error
    assert result.value is not None
    first = result.value.devices[0]
    assert (first.memory_total_bytes, first.memory_used_bytes, first.memory_free_bytes) == (
        80 * 2**30,
        70 * 2**30,
        10 * 2**30,
    )
    assert [p.owner for p in first.processes] == [ProcessOwner.VLLM, ProcessOwner.OTHER]
    only_second = await _source(fetcher, server.url, gpu_indices=[1]).read()
    assert only_second.value is not None
    assert [d.index for d in only_second.value.devices] == [1]
    missing = await _source(fetcher, server.url, gpu_indices=[3]).read()
    assert missing.error is not None
    assert "has no GPU 3: 2 GPUs simulated" in missing.error


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "Expecting value"),
        (b"[]", "lacks 'gpus'"),
        (json.dumps({"gpus": [{**GPU, "used_bytes": "lots"}]}).encode(), "'used_bytes' is not an integer"),
        (json.dumps({"gpus": [{**GPU, "processes": [{"pid": 1}]}]}).encode(), "lacks 'name'"),
        (json.dumps({"gpus": [{**GPU, "total_bytes": True}]}).encode(), "'total_bytes' is not an integer"),
    ],
)
async def test_malformed_documents_are_one_line_errors(
    server: LoopbackServer, fetcher: BodyFetcher, body: bytes, needle: str
) -> None:
    server.routes["/sim/gpu"] = respond(body=body)
    result = await _source(fetcher, server.url).read()
    assert result.error is not None
    assert needle in result.error
    assert "\n" not in result.error


async def test_down_slow_and_failing(server: LoopbackServer, fetcher: BodyFetcher) -> None:
    down = await _source(fetcher, f"http://127.0.0.1:{closed_port()}").read()
    assert down.error is not None
    assert "unreachable" in down.error
    server.routes["/sim/gpu"] = slow(2.0, respond(body=b"{}"))
    late = await _source(fetcher, server.url, timeout_s=0.5).read()
    assert late.error is not None
    assert "did not answer within 0.5 s" in late.error
    server.routes["/sim/gpu"] = respond(404)
    absent = await _source(fetcher, server.url).read()
    assert absent.error is not None
    assert "answered HTTP 404" in absent.error
