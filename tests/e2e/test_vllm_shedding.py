"""vLLM's own shedding, for real: vLLM 0.32 on CPU with --max-num-queued-reqs answers 503 to what would take its
running plus waiting requests past the cap, counts each refusal in vllm:admission_rejections_total{reason}, and the
sidecar exports exactly that count. On the shared session server (cap 16, 8 sequences): 16 long requests fill
running and waiting to the cap (vLLM's own gauges say when), then 16 more are sent at once. (Sending all at once
let the first ones finish before the last arrived on a busy CI machine: none was refused. And 8 more were not
enough either: the 8 running requests of the first wave, all the same length, end together, and on a box busy with
other test lanes that can happen before the second wave is in, leaving room for all 8. With 16, at least 8 are
refused unless the whole first wave ended, which takes two of its batches.)
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
OVER_CAP = QUEUE_CAP
LONG_TOKENS = 480  # of --max-model-len 512: the first wave stays in for seconds, a window to send the second in
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.MULTILINE)
WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.MULTILINE)
REFUSED = re.compile(r'^vllm:admission_rejections_total\{model_name="tiny-llama",reason="max_num_queued_reqs"\} (\S+)$')


def _refused(text: str) -> float:
    found = [float(match.group(1)) for line in text.splitlines() if (match := REFUSED.match(line))]
    assert len(found) == 1, "vLLM 0.32 pre-creates one series per reason"
    return found[0]


def _post_at_once(client: httpx.Client, count: int, max_tokens: int) -> list[httpx.Response]:
    """`count` completions sent together: one client (so no thread spends its start building an SSL context) and
    a barrier."""
    body = {"model": SERVED_MODEL_NAME, "prompt": "the cache holds every token", "max_tokens": max_tokens}
    body["ignore_eos"] = True
    barrier = threading.Barrier(count)

    def post(_: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return client.post("/v1/completions", json=body)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(post, range(count)))


def _in_vllm(url: str) -> float:
    """Running plus waiting requests, as vLLM's own gauges say."""
    text = fetch_metrics(url)
    return sum(float(match.group(1)) for pattern in (RUNNING, WAITING) for match in pattern.finditer(text))


def _fill_then_overflow(url: str) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """The first wave (the cap's worth of long requests) in the background; once vLLM holds all of them, the
    second wave at once. Both waves' answers."""
    # The shared server may still be finishing an earlier test's requests (a load whose client was killed): those
    # would count against the cap and have the first wave refused at once (CI runs 19 and 21: the first wave
    # "answered", vLLM never seen holding it). Start from an idle vLLM.
    idle_by = time.monotonic() + 120
    while (busy := _in_vllm(url)) > 0:
        assert time.monotonic() < idle_by, f"vLLM still holds {busy:g} requests of earlier tests after 120 s"
        time.sleep(0.2)
    limits = httpx.Limits(max_connections=QUEUE_CAP + OVER_CAP, max_keepalive_connections=QUEUE_CAP + OVER_CAP)
    with httpx.Client(base_url=url, timeout=120, limits=limits) as client, ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(_post_at_once, client, QUEUE_CAP, LONG_TOKENS)
        # A bounded wait on the real vLLM taking the first wave in. Its gauges move only with the engine's steps,
        # and this lane runs at nice 10: CI run 19, with one more lane beside it, saw none in 30 s.
        deadline = time.monotonic() + 90
        while (held := _in_vllm(url)) < QUEUE_CAP and time.monotonic() < deadline and not first.done():
            time.sleep(0.05)
        ended = ""
        if first.done():
            codes = sorted(r.status_code for r in first.result()) if first.exception() is None else first.exception()
            ended = f"; the first wave ended: {codes}"
        assert held >= QUEUE_CAP, f"vLLM took in {held:g} of the first wave's {QUEUE_CAP} requests in 90 s{ended}"
        second = _post_at_once(client, OVER_CAP, 16)
        return first.result(timeout=120), second


def test_vllms_own_refusals_are_counted_and_exported(vllm_server: VllmServer, tmp_path: Path) -> None:
    sidecar = SidecarProcess(["--vllm-url", vllm_server.base_url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready(timeout_s=30)
        before = _refused(fetch_metrics(vllm_server.base_url))
        first, second = _fill_then_overflow(vllm_server.base_url)
        assert [response.status_code for response in first] == [200] * QUEUE_CAP
        refused = [response for response in second if response.status_code == 503]
        codes = sorted(response.status_code for response in second)
        assert refused, f"{OVER_CAP} requests over a full cap of {QUEUE_CAP}: none refused ({codes})"
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
