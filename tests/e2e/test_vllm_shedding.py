"""vLLM's own shedding, for real: vLLM 0.32 on CPU with --max-num-queued-reqs answers 503 to what would take its
running plus waiting requests past the cap, counts each refusal in vllm:admission_rejections_total{reason}, and the
sidecar exports exactly that count. On the shared session server (cap 16, 8 sequences): 24 requests at once.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess

from .conftest import QUEUE_CAP
from .vllm.load import fetch_metrics
from .vllm.server import SERVED_MODEL_NAME, VllmServer

pytestmark = pytest.mark.e2e
AT_ONCE = QUEUE_CAP + 8
REFUSED = re.compile(r'^vllm:admission_rejections_total\{model_name="tiny-llama",reason="max_num_queued_reqs"\} (\S+)$')


def _refused(text: str) -> float:
    found = [float(match.group(1)) for line in text.splitlines() if (match := REFUSED.match(line))]
    assert len(found) == 1, "vLLM 0.32 pre-creates one series per reason"
    return found[0]


def _post_at_once(url: str, count: int) -> list[httpx.Response]:
    """`count` completions sent together: one client (so no thread spends its start building an SSL context,
    which spread 24 arrivals over long enough for the first requests to finish in CI) and a barrier."""
    body = {"model": SERVED_MODEL_NAME, "prompt": "the cache holds every token", "max_tokens": 200, "ignore_eos": True}
    barrier = threading.Barrier(count)
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    with httpx.Client(base_url=url, timeout=120, limits=limits) as client:

        def post(_: int) -> httpx.Response:
            barrier.wait(timeout=30)
            return client.post("/v1/completions", json=body)

        with ThreadPoolExecutor(max_workers=count) as pool:
            return list(pool.map(post, range(count)))


def test_vllms_own_refusals_are_counted_and_exported(vllm_server: VllmServer, tmp_path: Path) -> None:
    sidecar = SidecarProcess(["--vllm-url", vllm_server.base_url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready(timeout_s=30)
        before = _refused(fetch_metrics(vllm_server.base_url))
        responses = _post_at_once(vllm_server.base_url, AT_ONCE)
        codes = sorted(response.status_code for response in responses)
        refused = [response for response in responses if response.status_code == 503]
        assert codes.count(200) >= QUEUE_CAP, codes
        assert refused, f"{AT_ONCE} requests at once against a cap of {QUEUE_CAP}: none refused ({codes})"
        assert "cannot accept new requests" in refused[0].text
        after = _refused(fetch_metrics(vllm_server.base_url))
        assert after - before == len(refused)

        deadline = time.monotonic() + 15
        exported: dict[str, object] = {}
        while time.monotonic() < deadline:
            # Empty while a poll of vLLM fails (a slow answer on a busy machine): the next one will do.
            models = sidecar.get("/status").json()["models"]
            if len(models) == 1:
                (exported,) = models
                if exported["admission_rejections_total"] == after:
                    break
            time.sleep(0.25)
        assert exported, "the sidecar's /status listed no model for 15 s"
        assert exported["model_name"] == SERVED_MODEL_NAME
        assert exported["admission_rejections_total"] == after
        assert exported["admission_rejections_by_reason"] == {"max_num_queued_reqs": after, "max_num_queued_tokens": 0}
        assert exported["admission_rejections_in_window"] == after - before
        text = sidecar.get("/metrics").text
        assert f'vllm_sidecar_vllm_rejections_in_window{{model_name="tiny-llama"}} {float(after - before)}' in text
    finally:
        sidecar.kill()
