"""What the sidecar exports from vLLM's queue reasons, own rejections, fault tolerance and preemptions."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.exporter import names
from sidecar.exporter.collector import SidecarCollector
from sidecar.model.view import View
from sidecar.model.vllm import ModelMetrics
from tests.unit.builders import cache_config, engine, snapshot

Samples = dict[str, list[tuple[dict[str, str], float]]]
M0 = {"model_name": "m", "engine": "0"}


def _samples(view: View) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(version="9.9.9", latest_view=lambda: view))
    found: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _view(steps: int, **engine_values: object) -> View:
    """`steps` polls 2 s apart of one engine with 4 preemptions and 3 rejections per poll."""
    window, deriver = Window(span_s=600), Deriver(DeriveSettings())
    derived = None
    for step in range(steps):
        models = (
            ModelMetrics(
                model_name="m",
                admission_rejections_total=3.0 * step,
                admission_rejections_by_reason=(("max_num_queued_reqs", 3.0 * step),),
            ),
        )
        values = {"preemptions_total": 4.0 * step, "generation_tokens_total": 10.0 * step, **engine_values}
        window.push(snapshot(2.0 * step, (engine(**values),), models=models))
        derived = deriver.derive(window)
    latest = window.latest()
    assert latest is not None
    assert derived is not None
    return View(snapshot=latest, derived=derived)


def test_the_new_series_with_their_labels_and_values() -> None:
    samples = _samples(
        _view(
            8,
            requests_waiting=8.0,
            requests_waiting_capacity=6.0,
            requests_waiting_deferred=2.0,
            engine_healthy=False,
            cache_config=cache_config(kv_cache_size_tokens=4000),
        )
    )
    assert samples["vllm_sidecar_kv_cache_capacity_tokens"] == [(M0, 4000.0)]
    assert samples["vllm_sidecar_preemptions_per_second"] == [(M0, 2.0)]  # 4 per 2 s poll
    assert samples["vllm_sidecar_preemptions_in_window"] == [(M0, 28.0)]  # 0 -> 28 over 8 polls
    assert samples["vllm_sidecar_requests_waiting_deferred_ratio"] == [(M0, 0.25)]
    assert samples["vllm_sidecar_engine_unhealthy_seconds"] == [(M0, 14.0)]
    assert samples["vllm_sidecar_vllm_rejections_per_second"] == [({"model_name": "m"}, 1.5)]
    assert samples["vllm_sidecar_vllm_rejections_in_window"] == [({"model_name": "m"}, 21.0)]


def test_what_vllm_does_not_report_is_absent() -> None:
    # One poll of a vLLM before 0.20 without fault tolerance and without the rejection counter.
    window = Window(span_s=600)
    window.push(snapshot(0.0, (engine(cache_config=cache_config(kv_cache_size_tokens=None)),)))
    view = View(snapshot=window.latest(), derived=Deriver(DeriveSettings()).derive(window))  # type: ignore[arg-type]
    samples = _samples(view)
    for absent in (
        "vllm_sidecar_preemptions_per_second",
        "vllm_sidecar_preemptions_in_window",
        "vllm_sidecar_requests_waiting_deferred_ratio",
        "vllm_sidecar_engine_unhealthy_seconds",
        "vllm_sidecar_vllm_rejections_per_second",
        "vllm_sidecar_vllm_rejections_in_window",
    ):
        assert absent not in samples, absent
    assert samples["vllm_sidecar_kv_cache_capacity_tokens"] == [(M0, 128.0 * 32)]  # blocks x block size


def test_a_healthy_engine_under_fault_tolerance_reads_zero() -> None:
    assert _samples(_view(3, engine_healthy=True))["vllm_sidecar_engine_unhealthy_seconds"] == [(M0, 0.0)]


def test_the_help_names_the_short_horizon_the_deriver_uses() -> None:
    polls = DeriveSettings().short_horizon_polls
    assert f"the last {polls} polls" == names.SHORT_HORIZON
    assert names.SHORT_HORIZON in names.PREEMPTIONS_RATE.help
    assert names.SHORT_HORIZON in names.VLLM_REJECTIONS_RATE.help


def test_promtool_check_metrics_is_clean() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    registry = CollectorRegistry(auto_describe=False)
    view = _view(4, engine_healthy=True, requests_waiting_capacity=0.0, requests_waiting_deferred=1.0)
    registry.register(SidecarCollector(version="9.9.9", latest_view=lambda: view))
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry).decode(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
