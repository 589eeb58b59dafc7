"""The source boundary: whatever vLLM answers, a tick produces a reading or a one-line problem, never a raise.

The bytes go through the real path: httpx (a MockTransport in place of the network) -> `VllmHttpSource.read`
(decode, parse, read per engine) -> `Poller.tick` (window, derive, the transition log) -> the policy
(`Acting.observe`, dry run) -> what the exporter renders from that view (/status JSON, /metrics, /readyz).
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import structlog
from hypothesis import event, example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from sidecar.actuators.none import NoActuator
from sidecar.derive.settings import DeriveSettings
from sidecar.exporter.collector import SidecarCollector
from sidecar.exporter.endpoints import Endpoints, Liveness
from sidecar.exporter.server import Request, Response
from sidecar.model.source import SourceResult
from sidecar.model.vllm import VllmReading
from sidecar.notify.message import Notification
from sidecar.parse.vllm import CACHE_CONFIG, KEPT_SAMPLES, KV_USAGE, RUNNING, WAITING
from sidecar.policy.machine import Policy
from sidecar.policy.settings import PolicySettings
from sidecar.shell.acting import Acting
from sidecar.shell.poller import Poller
from sidecar.shell.state_file import StateFile
from sidecar.sources.fetch import HttpxFetcher
from sidecar.sources.vllm_http import VllmHttpSource
from tests.property.exposition_grammar import escape_label_value, expositions
from tests.property.profile import budget

URL = "http://vllm.test"


def _source(client: httpx.AsyncClient) -> VllmHttpSource:
    return VllmHttpSource(fetcher=HttpxFetcher(client), base_url=URL, timeout_s=5.0, max_body_bytes=1 << 20)


def _check_result(result: SourceResult[VllmReading]) -> None:
    assert (result.error is None) == (result.value is not None)
    if result.error is not None:
        # vLLM named first, or the server said not to be vLLM (a 404 or a body that is no exposition)
        assert result.error.startswith(("vLLM ", f"{URL} answers, but is not vLLM: ")), result.error
        assert result.wrong_server == result.error.startswith(f"{URL} answers, but is not vLLM: ")
        assert "\n" not in result.error
    else:
        assert result.value is not None
        assert all("\n" not in problem for problem in result.value.problems)
    assert math.isfinite(result.duration_s)
    assert result.duration_s >= 0


# --- 1. Any answer at all, straight into the source -----------------------------------------------------

_statuses = st.sampled_from([200, 200, 200, 204, 301, 404, 500, 503])
_vllmish = st.sampled_from(
    [
        b"vllm:num_requests_running 1\n",
        b'vllm:kv_cache_usage_perc{engine="0"} 0.5\n',
        b"# TYPE x gauge\n",
        b"\xff\xfe",
        b"\x00",
        b"{",
        b'"',
        b"\\",
        b"\n",
        b"\r\n",
        b" ",
        b"NaN",
        b"+Inf",
        b"\xc2\xb2",
        b"<html>",
    ]
)
_bodies = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(_vllmish, st.binary(max_size=3)), max_size=30).map(b"".join),
    expositions(max_families=3).map(lambda generated: generated.text.encode()),
)
# What /version may answer: JSON of any shape (a deep one included), or anything.
_json_documents = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["version", "v"]), inner, max_size=2),
)
_versions = st.one_of(
    st.binary(max_size=50),
    _json_documents.map(lambda document: json.dumps(document).encode()),
    st.integers(500, 20000).map(lambda depth: b"[" * depth),  # json recursion gives up near 1000
)


def _transport(metrics: tuple[int, bytes], version: tuple[int, bytes], health: int) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        status, body = {"/metrics": metrics, "/version": version}.get(request.url.path, (health, b""))
        return httpx.Response(status, content=body)

    return httpx.MockTransport(answer)


@budget()
@given(st.tuples(_statuses, _bodies), st.tuples(_statuses, _versions), _statuses)
@example((200, b"vllm:num_requests_running 1\n"), (200, b"[" * 5000), 200)  # used to raise RecursionError
@example((200, b'vllm:kv_cache_usage_perc{engine="\xc2\xb2"} 0.5\n'), (404, b""), 200)  # used to raise ValueError
@example(  # an engine label with a line break used to make a two-line problem (a forged log line)
    (200, b'vllm:kv_cache_usage_perc{engine="a\\nb"} 0.5\nvllm:cache_config_info{num_gpu_blocks="None"} 1\n'),
    (404, b""),
    200,
)
def test_any_answer_is_a_reading_or_a_one_line_problem(
    metrics: tuple[int, bytes], version: tuple[int, bytes], health: int
) -> None:
    async def read() -> None:
        async with httpx.AsyncClient(transport=_transport(metrics, version, health)) as client:
            source = _source(client)
            result = await source.read()
            _check_result(result)
            event("a reading" if result.ok else "a problem")
            assert isinstance((await source.health()).ok, bool)

    asyncio.run(read())


# --- 2. vLLM-shaped answers with any values, through the whole tick -------------------------------------

_KEPT = [*sorted(KEPT_SAMPLES - {CACHE_CONFIG}), "vllm:prompt_tokens_created"]
_label_text = st.one_of(
    st.sampled_from(["0", "1", "12", "", "\u00b2", "\u0661", "-1", "m", "a b", "a\nb"]), st.text(max_size=4)
)
_values = st.one_of(
    st.floats(),
    st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e-320, 1e308, -1e308, 1.7976931348623157e308, 2.0**53]),
)
_config_values = st.one_of(
    st.sampled_from(["16", "0", "-1", "1e300", "1e308", "nan", "inf", "-inf", "None", "1.5", "\u00b2", "0x10"]),
    st.text(max_size=4),
)
_CONFIG_LABELS = (
    "num_gpu_blocks",
    "block_size",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "kv_cache_size_tokens",
)


def _line(name: str, labels: dict[str, str], value: float) -> str:
    inside = ",".join(f'{key}="{escape_label_value(text)}"' for key, text in labels.items())
    return f"{name}{{{inside}}} {value!r}\n"


_cache_configs = st.one_of(
    st.fixed_dictionaries(  # what vLLM writes, with sizes from tiny to absurd
        {
            "num_gpu_blocks": st.sampled_from(["1000", "16", "1", "0", "1e300", "None", "None"]),  # None: 0.8, unsized
            "block_size": st.sampled_from(["16", "1"]),
        }
    ),
    st.dictionaries(st.sampled_from([*_CONFIG_LABELS, "engine"]), _config_values, max_size=6),
)
_engine_labels = st.dictionaries(st.sampled_from(["model_name", "engine", "pid"]), _label_text, max_size=3)


@st.composite
def _vllm_bodies(draw: st.DrawFn) -> bytes:
    """One engine as vLLM describes it (usage, running, waiting, its cache config), then any other kept samples."""
    engine = draw(_engine_labels) | {"engine": draw(_label_text)}  # V1 labels every engine-scoped series
    lines = [_line(name, engine, draw(_values)) for name in (KV_USAGE, RUNNING, WAITING) if draw(st.integers(0, 4))]
    lines += [_line(CACHE_CONFIG, config, 1.0) for config in draw(st.lists(_cache_configs, max_size=2))]
    others = draw(st.lists(st.sampled_from(_KEPT), max_size=6))
    lines += [_line(name, draw(_engine_labels), draw(_values)) for name in others]
    return "".join(lines).encode()


_ticks = st.lists(
    st.tuples(_vllm_bodies(), st.sampled_from([200, 200, 503]), st.floats(0.001, 1000)), min_size=1, max_size=3
)


@contextmanager
def _acting(clock: list[float]) -> Iterator[Acting]:
    with tempfile.TemporaryDirectory(prefix="property-acting-") as folder:
        notes: list[Notification] = []
        yield Acting(
            policy=Policy(PolicySettings()),
            actuator=NoActuator(),
            ledger_file=StateFile(Path(folder) / "restart-ledger.json"),
            notify=notes.append,
            logger=structlog.get_logger(),
            dry_run=True,
            clock=lambda: clock[0],
            wall_clock=lambda: 1.7e9 + clock[0],
        )


def _no_nan_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"/status holds {constant}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


_DENORMAL_RUNNING = (
    b"vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 1e-320\n"
    b'vllm:cache_config_info{num_gpu_blocks="1000",block_size="16"} 1.0\n'
)

_HUGE_BLOCK_SIZE = (
    b'vllm:num_requests_waiting{engine="0"} 0.0\nvllm:cache_config_info{num_gpu_blocks="16",block_size="1e308"} 1.0\n'
)


@budget()
@given(_ticks)
@example([(_DENORMAL_RUNNING, 200, 2.0)])  # used to crash /status: blocks per request = 500 / 1e-320
@example([(_HUGE_BLOCK_SIZE, 200, 1.0)])  # used to fail /metrics: 16 x int(1e308) tokens is no float
def test_any_vllm_values_go_through_the_whole_tick_and_every_endpoint(ticks: list[tuple[bytes, int, float]]) -> None:
    clock = [1000.0]
    served: list[tuple[bytes, int]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body, health = served[-1]
        if request.url.path == "/metrics":
            return httpx.Response(200, content=body)
        return httpx.Response(health if request.url.path == "/health" else 404)

    async def run() -> None:
        with _acting(clock) as acting, capture_logs():
            async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
                poller = Poller(
                    vllm=_source(client),
                    gpu=None,
                    derive=DeriveSettings(),
                    clock=lambda: clock[0],
                    wall_clock=lambda: 1.7e9 + clock[0],
                    logger=structlog.get_logger(),
                    on_view=acting.observe,
                )
                registry = CollectorRegistry(auto_describe=False)
                registry.register(
                    SidecarCollector(version="t", latest_view=lambda: poller.view, acting_view=acting.view)
                )
                endpoints = Endpoints(
                    registry=registry,
                    latest_view=lambda: poller.view,
                    liveness=lambda: Liveness(alive=True, reason="ok"),
                    vllm_url=URL,
                    version="t",
                    readiness=acting.readiness,
                    acting_view=acting.view,
                )
                for body, health, elapsed_s in ticks:
                    served.append((body, health))
                    clock[0] += elapsed_s
                    view = await poller.tick()
                    _check_result(view.snapshot.vllm)
                    event(f"engines derived: {min(len(view.derived.engines), 2)}")
                    await _check_endpoints(endpoints)

    asyncio.run(run())


async def _get(endpoints: Endpoints, path: str) -> Response:
    return await endpoints.handle(Request(method="GET", path=path, headers={}, body=b"", peer="127.0.0.1:1"))


async def _check_endpoints(endpoints: Endpoints) -> None:
    status = await _get(endpoints, "/status")
    assert status.status == 200
    assert isinstance(_no_nan_json(status.body.decode()), dict)
    metrics = await _get(endpoints, "/metrics")
    assert metrics.status == 200
    assert list(text_string_to_metric_families(metrics.body.decode()))
    assert (await _get(endpoints, "/readyz")).status in (200, 503)
