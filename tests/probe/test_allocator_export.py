"""The allocator probe's metrics on /metrics: names, types and labels from the contract, the source's success
only when every file was usable, and a clean `promtool check metrics`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.exporter.collector import SidecarCollector
from sidecar.model.allocator import AllocatorReading
from sidecar.model.source import SourceResult
from sidecar.model.view import View
from sidecar.parse.probe_file import parse_probe_file
from tests.probe.documents import GIB, device, document
from tests.unit.builders import engine, snapshot

TORCH_METRICS = {
    "vllm_sidecar_torch_allocated_bytes": "gauge",
    "vllm_sidecar_torch_reserved_bytes": "gauge",
    "vllm_sidecar_torch_inactive_split_bytes": "gauge",
    "vllm_sidecar_torch_fragmentation_ratio": "gauge",
    "vllm_sidecar_torch_alloc_retries": "counter",
    "vllm_sidecar_torch_ooms": "counter",
}


def _exposition(problems: tuple[str, ...] = ()) -> str:
    window = Window(span_s=600)
    deriver = Deriver(DeriveSettings())
    for step in range(3):
        processes = tuple(
            parse_probe_file(json.dumps(d).encode())
            for d in (
                document(100, time_unix_s=1.0, rank=0, devices=[device(0, num_alloc_retries=step, num_ooms=1)]),
                document(101, time_unix_s=1.0, rank=1, devices=[device(1)]),
                document(99, time_unix_s=1.0, role="api", rank=None, devices=[]),
            )
        )
        base = snapshot(2.0 * step, (engine(),))
        allocator = SourceResult(
            source="probe", duration_s=0.001, value=AllocatorReading(processes=processes, problems=problems)
        )
        window.push(dataclasses.replace(base, allocator=allocator))
        derived = deriver.derive(window)
    latest = window.latest()
    assert latest is not None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(version="1", latest_view=lambda: View(snapshot=latest, derived=derived)))
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_the_contracts_torch_metrics_by_gpu_and_rank() -> None:
    text = _exposition()
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    for name, kind in TORCH_METRICS.items():
        assert types[name] == kind, name
    samples = _samples(text)
    assert samples["vllm_sidecar_torch_reserved_bytes"] == [
        ({"gpu": "0", "rank": "0"}, 8.0 * GIB),
        ({"gpu": "1", "rank": "1"}, 8.0 * GIB),
    ]
    assert samples["vllm_sidecar_torch_fragmentation_ratio"][0] == ({"gpu": "0", "rank": "0"}, 0.25)
    assert samples["vllm_sidecar_torch_alloc_retries_total"][0] == ({"gpu": "0", "rank": "0"}, 2.0)
    assert samples["vllm_sidecar_torch_ooms_total"][0] == ({"gpu": "0", "rank": "0"}, 1.0)
    assert ({"source": "probe"}, 1.0) in samples["vllm_sidecar_source_success"]


def test_an_unusable_file_turns_the_source_to_failing_while_the_rest_is_exported() -> None:
    samples = _samples(_exposition(problems=("31.json: the worker process stopped sampling 9 s ago (stale)",)))
    assert ({"source": "probe"}, 0.0) in samples["vllm_sidecar_source_success"]
    assert len(samples["vllm_sidecar_torch_reserved_bytes"]) == 2


def test_promtool_check_metrics_is_clean() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=_exposition(), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
