"""vLLM's own shedding, for real: vLLM 0.32 on CPU with --max-num-queued-reqs answers 503 to what would take its
unfinished requests past the cap, counts each refusal in vllm:admission_rejections_total{reason}, and the sidecar
exports exactly that count. On the shared session server (cap 16):

1. the EngineCore is paused (SIGSTOP), so that no request can finish;
2. 16 streamed requests fill the cap: the API server counts its unfinished requests itself and answers each
   stream's headers (200) once it has taken the request in, engine or not;
3. 16 more are sent: every one is refused (503);
4. the engine is resumed (SIGCONT) and the 16 streams complete.

(Earlier versions waited for vLLM's own gauges to show the cap held while the engine ran, and raced the first
wave's end on a busy CI machine: in CI run 24 the first wave ended before the second was in, which then fitted;
beside two busy cores the gauges were never seen at 16 at all.)
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.adapters.daemon_process import SidecarProcess

from .conftest import QUEUE_CAP
from .vllm.load import fetch_metrics
from .vllm.server import SERVED_MODEL_NAME, VllmServer

pytestmark = pytest.mark.e2e
OVER_CAP = QUEUE_CAP
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.MULTILINE)
WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.MULTILINE)
REFUSED = re.compile(r'^vllm:admission_rejections_total\{model_name="tiny-llama",reason="max_num_queued_reqs"\} (\S+)$')
BODY = {"model": SERVED_MODEL_NAME, "prompt": "the cache holds every token", "max_tokens": 16}


def _refused(text: str) -> float:
    found = [float(match.group(1)) for line in text.splitlines() if (match := REFUSED.match(line))]
    assert len(found) == 1, "vLLM 0.32 pre-creates one series per reason"
    return found[0]


def _in_vllm(url: str) -> float:
    """Running plus waiting requests, as vLLM's own gauges say."""
    text = fetch_metrics(url)
    return sum(float(match.group(1)) for pattern in (RUNNING, WAITING) for match in pattern.finditer(text))


def _wait_idle(url: str) -> None:
    """The shared server may still be finishing an earlier test's requests (a load whose client was killed): those
    would count against the cap. Start from an idle vLLM."""
    idle_by = time.monotonic() + 120
    while (busy := _in_vllm(url)) > 0:
        assert time.monotonic() < idle_by, f"vLLM still holds {busy:g} requests of earlier tests after 120 s"
        time.sleep(0.2)


@contextmanager
def _engine_paused(server: VllmServer) -> Iterator[None]:
    engines = server.engine_core_pids()
    assert engines, "no EngineCore process under the vLLM server"
    for pid in engines:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in engines:
            os.kill(pid, signal.SIGCONT)


def _completed(stream: httpx.Response) -> bool:
    """True when a streamed completion ran to vLLM's closing `data: [DONE]`."""
    return any(line == "data: [DONE]" for line in stream.iter_lines())


def _fill_then_overflow(server: VllmServer) -> tuple[list[bool], list[httpx.Response | None]]:
    """The cap filled with streams while the engine is paused, then the second wave sent one by one. Whether each
    stream completed once the engine resumed, and the second wave's answers (None: no answer in 10 s, i.e. taken
    in, waiting for the paused engine)."""
    url = server.base_url
    _wait_idle(url)
    limits = httpx.Limits(max_connections=QUEUE_CAP + 1)
    with httpx.Client(base_url=url, timeout=60, limits=limits) as client, ExitStack() as streams:
        with _engine_paused(server):
            first: list[httpx.Response] = []
            for _ in range(QUEUE_CAP):
                request = client.build_request("POST", "/v1/completions", json={**BODY, "stream": True})
                response = client.send(request, stream=True)
                streams.callback(response.close)
                assert response.status_code == 200, f"the first wave's request {len(first) + 1}: {response.status_code}"
                first.append(response)
            second: list[httpx.Response | None] = []
            for _ in range(OVER_CAP):
                try:
                    second.append(client.post("/v1/completions", json=BODY, timeout=10))
                except httpx.TimeoutException:
                    second.append(None)
        return [_completed(stream) for stream in first], second


def test_vllms_own_refusals_are_counted_and_exported(vllm_server: VllmServer, tmp_path: Path) -> None:
    sidecar = SidecarProcess(["--vllm-url", vllm_server.base_url, "--interval", "0.5"], tmp_path / "sidecar.log")
    try:
        sidecar.wait_ready(timeout_s=30)
        before = _refused(fetch_metrics(vllm_server.base_url))
        first, second = _fill_then_overflow(vllm_server)
        assert first == [True] * QUEUE_CAP, "the first wave's streams, once the engine resumed"
        refused = [response for response in second if response and response.status_code == 503]
        codes = [response.status_code if response else "no answer" for response in second]
        assert len(refused) == OVER_CAP, f"{OVER_CAP} requests over a full cap of {QUEUE_CAP}: {codes}"
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
