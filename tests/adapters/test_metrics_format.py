"""/metrics in the format the scraper asks for, with the sidecar's own process_* metrics.

prometheus_client is the oracle twice over: its `choose_encoder` picks the format, and its two parsers (the
strict OpenMetrics one and the text one) must read what is served under the content type it is served with.
promtool lints the text format. A real Prometheus scrape (which asks for OpenMetrics) is in
tests/security/test_tls.py, beside the daemon it already starts.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from sidecar.exporter.collector import SidecarCollector
from sidecar.exporter.endpoints import Endpoints, Liveness
from sidecar.exporter.server import Request, Response
from tests.adapters.test_exporter import _acting_view, _busy_view
from tests.conftest import required_in_ci
from tests.property.profile import budget

PROMETHEUS_ACCEPT = (  # what Prometheus 2.42 sends (scrape/scrape.go, acceptHeader)
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"  # then the name escaping, if asked
TEXT = "text/plain; version=0.0.4; charset=utf-8"
PROCESS_METRICS = {
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
}


VIEW = _busy_view()


def _registry() -> CollectorRegistry:
    """The daemon's registry as `Daemon` builds it: the sidecar's collector and the process collector."""
    acting = _acting_view(restarts={"engine_hung": 1}, actions={"drain": 1})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(version="9.9.9", latest_view=lambda: VIEW, acting_view=lambda: acting))
    ProcessCollector(registry=registry)
    return registry


REGISTRY = _registry()
ENDPOINTS = Endpoints(  # the same view behind /metrics and /status, as in the daemon
    registry=REGISTRY,
    latest_view=lambda: VIEW,
    liveness=lambda: Liveness(alive=True, reason="ok"),
    vllm_url="http://vllm:8000",
    version="9.9.9",
)


def _get(accept: str | None, method: str = "GET") -> Response:
    headers = {} if accept is None else {"accept": accept}
    request = Request(method=method, path="/metrics", headers=headers, body=b"", peer="127.0.0.1:1")
    return asyncio.run(ENDPOINTS.handle(request))


def _samples(response: Response) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, read by the parser of the format the content type names (the strict one for OpenMetrics)."""
    text = response.body.decode()
    parse = openmetrics_families if response.content_type.startswith("application/openmetrics-text") else text_families
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parse(text)
        for sample in family.samples
    }


def test_prometheus_gets_openmetrics_and_everyone_else_the_text_format() -> None:
    openmetrics = _get(PROMETHEUS_ACCEPT)
    assert openmetrics.status == 200
    assert openmetrics.content_type.startswith(OPENMETRICS)
    assert openmetrics.body.endswith(b"# EOF\n")
    for accept in (None, "", "text/plain", "*/*", "text/plain;version=0.0.4", "application/json"):
        text = _get(accept)
        assert text.status == 200
        assert text.content_type == TEXT, accept
        assert b"# EOF" not in text.body


def test_both_formats_carry_the_same_series_including_the_process_metrics() -> None:
    openmetrics, text = _samples(_get(PROMETHEUS_ACCEPT)), _samples(_get(None))
    assert set(openmetrics) == set(text)  # the same sample names and labels, read by each format's own parser
    names = {name for name, _ in text}
    assert names >= PROCESS_METRICS
    assert "vllm_sidecar_restarts_total" in names
    assert "vllm_sidecar_build_info" in names
    steady = {key: value for key, value in text.items() if not key[0].startswith("process_")}
    assert steady == {key: value for key, value in openmetrics.items() if not key[0].startswith("process_")}
    assert text[("process_resident_memory_bytes", ())] > 0
    assert text[("process_start_time_seconds", ())] > 1.6e9  # a Unix time, not seconds since boot
    assert text[("process_max_fds", ())] >= text[("process_open_fds", ())] > 0


@pytest.mark.parametrize(
    "accept",
    [
        PROMETHEUS_ACCEPT,
        "application/openmetrics-text",  # no version: prometheus_client's default one
        "application/openmetrics-text;version=1.0.0;escaping=underscores",
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
        "application/openmetrics-text;version=1.0.0;escaping=values",
    ],
)
def test_openmetrics_is_byte_for_byte_what_prometheus_client_writes(accept: str) -> None:
    # /metrics writes OpenMetrics with the library's `allow-utf-8` escaping instead of `underscores` (faster);
    # for this registry's names the two must agree to the byte, under the content type the library chose.
    served = _get(accept)
    library, content_type = choose_encoder(accept)
    expected = library(REGISTRY)
    assert served.content_type == content_type
    # process_* values move between the two writes (U__process__* under `values`); their names and labels,
    # and every other line, may not
    served_lines, expected_lines = served.body.decode().splitlines(), expected.decode().splitlines()
    assert len(served_lines) == len(expected_lines)
    for got, want in zip(served_lines, expected_lines, strict=True):
        if "process_" in got.split(" ", 1)[0]:
            assert got.rsplit(" ", 1)[0] == want.rsplit(" ", 1)[0]
        else:
            assert got == want


def test_the_openmetrics_types_are_native() -> None:
    types = {
        family.name: family.type
        for family in openmetrics_families(_get(PROMETHEUS_ACCEPT).body.decode())  # type: ignore[no-untyped-call]
        if family.name in ("vllm_sidecar_build", "vllm_sidecar_restarts", "process_cpu_seconds")
    }
    assert types == {"vllm_sidecar_build": "info", "vllm_sidecar_restarts": "counter", "process_cpu_seconds": "counter"}


def test_head_gets_the_negotiated_content_type_and_no_body_from_the_server() -> None:
    assert _get(PROMETHEUS_ACCEPT, method="HEAD").content_type.startswith(OPENMETRICS)


@budget(scale=0.5)
@given(
    st.one_of(
        st.text(max_size=60),
        st.lists(
            st.sampled_from(
                [
                    "application/openmetrics-text",
                    "application/openmetrics-text;version=1.0.0",
                    "application/openmetrics-text; version=abc",
                    "application/openmetrics-text;version=",
                    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
                    "application/openmetrics-text;version=\u0661.0.0",
                    "text/plain;version=1.0.0",
                    "text/plain;version=x.y",
                    "text/plain;escaping=values",
                    "*/*;q=0.1",
                    ";;;",
                    "=",
                ]
            ),
            max_size=4,
        ).map(",".join),
    )
)
@example("application/openmetrics-text; version=abc")  # prometheus_client's choose_encoder raises TypeError
@example("application/openmetrics-text; version=\u0661.0.0")  # int() reads an Arabic-Indic digit
@example("application/openmetrics-text;version=\xa01.0.0")  # int() skips a no-break space; it would be echoed
@example("application/openmetrics-text;version=1\t.0.0")
def test_any_accept_header_gets_200_and_a_body_its_content_type_parses(accept: str) -> None:
    accept = accept.encode("latin-1", "replace").decode("latin-1")  # header values arrive decoded as latin-1
    response = _get(accept)
    assert response.status == 200
    assert response.content_type.isascii()
    assert response.content_type.isprintable()
    names = {name for name, _ in _samples(response)}
    assert "vllm_sidecar_build_info" in names
    assert "process_resident_memory_bytes" in names


def test_promtool_lints_the_text_format_with_the_process_metrics_clean() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if required_in_ci():
            pytest.fail("promtool is required in CI (CI=true)", pytrace=False)
        pytest.skip("promtool not installed (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=_get(None).body, capture_output=True, check=False, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
