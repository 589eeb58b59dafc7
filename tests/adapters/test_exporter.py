"""The sidecar's own /metrics: names, types and HELP per the contract, read by prometheus_client, linted by promtool."""

from __future__ import annotations

import os
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
from sidecar.model.acting import ActingView
from sidecar.model.view import View
from tests.unit.builders import GIB, device, engine, snapshot

CONTRACT_METRICS = {
    "vllm_sidecar_up": "gauge",
    "vllm_sidecar_source_success": "gauge",
    "vllm_sidecar_source_duration_seconds": "gauge",
    "vllm_sidecar_last_poll_timestamp_seconds": "gauge",
    "vllm_sidecar_build_info": "gauge",
    "vllm_sidecar_kv_cache_usage_ratio": "gauge",
    "vllm_sidecar_kv_cache_capacity_blocks": "gauge",
    "vllm_sidecar_kv_cache_block_size_tokens": "gauge",
    "vllm_sidecar_kv_cache_used_blocks": "gauge",
    "vllm_sidecar_kv_cache_blocks_per_request": "gauge",
    "vllm_sidecar_kv_cache_request_headroom": "gauge",
    "vllm_sidecar_kv_cache_fragmentation_ratio": "gauge",
    "vllm_sidecar_prefix_cache_hit_ratio": "gauge",
    "vllm_sidecar_engine_stalled_seconds": "gauge",
    "vllm_sidecar_gpu_memory_total_bytes": "gauge",
    "vllm_sidecar_gpu_memory_used_bytes": "gauge",
    "vllm_sidecar_gpu_memory_budget_bytes": "gauge",
    "vllm_sidecar_gpu_memory_over_budget_bytes": "gauge",
    "vllm_sidecar_gpu_memory_growth_bytes_per_second": "gauge",
    "vllm_sidecar_gpu_time_to_oom_seconds": "gauge",
}


def _exposition(view: View | None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(version="9.9.9", latest_view=lambda: view))
    return generate_latest(registry).decode()


def _busy_view() -> View:
    window = Window(span_s=600)
    deriver = Deriver(DeriveSettings(min_trend_points=3, min_trend_span_s=2))
    for step in range(5):
        t = 2.0 * step
        window.push(
            snapshot(
                t,
                (
                    engine(
                        requests_running=4.0,
                        prefix_cache_queries_total=100.0 * step,
                        prefix_cache_hits_total=30.0 * step,
                    ),
                ),
                devices=(device(used=40 * GIB + step * 2**20),),
            )
        )
        derived = deriver.derive(window)
    latest = window.latest()
    assert latest is not None
    return View(snapshot=latest, derived=derived)


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_every_contract_metric_is_exported_with_its_type_and_labels() -> None:
    text = _exposition(_busy_view())
    types = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            types[sample.name] = family.type
    for name, kind in CONTRACT_METRICS.items():
        assert name in types, name
        assert types[name] in (kind, "info"), name
    samples = _samples(text)
    assert samples["vllm_sidecar_build_info"] == [({"version": "9.9.9"}, 1.0)]
    assert samples["vllm_sidecar_up"] == [({}, 1.0)]
    assert samples["vllm_sidecar_kv_cache_capacity_blocks"] == [({"engine": "0", "model_name": "m"}, 128.0)]
    ((hit_labels, hit_ratio),) = samples["vllm_sidecar_prefix_cache_hit_ratio"]
    assert hit_labels == {"engine": "0", "model_name": "m"}
    assert hit_ratio == pytest.approx(0.3)
    ((growth_labels, growth),) = samples["vllm_sidecar_gpu_memory_growth_bytes_per_second"]
    assert growth_labels == {"gpu": "0"}
    assert growth == pytest.approx(2**19)
    assert {labels["owner"] for labels, _ in samples["vllm_sidecar_gpu_process_memory_bytes"]} == {
        "vllm",
        "other",
        "unknown",
    }


def test_help_text_comes_from_the_one_names_module() -> None:
    text = _exposition(_busy_view())
    helps = {family.name: family.documentation for family in text_string_to_metric_families(text)}
    for spec in names.ALL:
        assert helps[spec.exposed_name] == spec.help
    assert "half empty" in helps["vllm_sidecar_kv_cache_fragmentation_ratio"]


def test_unknown_values_are_absent_never_zero() -> None:
    window = Window(span_s=60)
    window.push(snapshot(0.0, (engine(requests_running=0.0, kv_cache_usage_ratio=0.0),)))
    view = View(snapshot=window.latest(), derived=Deriver(DeriveSettings()).derive(window))  # type: ignore[arg-type]
    samples = _samples(_exposition(view))
    for absent in (
        "vllm_sidecar_kv_cache_blocks_per_request",
        "vllm_sidecar_kv_cache_request_headroom",
        "vllm_sidecar_kv_cache_fragmentation_ratio",
        "vllm_sidecar_prefix_cache_hit_ratio",
    ):
        assert absent not in samples


def test_vllm_down_exports_up_zero_and_no_engine_series() -> None:
    window = Window(span_s=60)
    window.push(snapshot(0.0, vllm_error="vLLM unreachable"))
    view = View(snapshot=window.latest(), derived=Deriver(DeriveSettings()).derive(window))  # type: ignore[arg-type]
    samples = _samples(_exposition(view))
    assert samples["vllm_sidecar_up"] == [({}, 0.0)]
    assert samples["vllm_sidecar_source_success"] == [({"source": "vllm"}, 0.0)]
    assert samples["vllm_sidecar_problems"] == [({}, 1.0)]
    assert "vllm_sidecar_kv_cache_usage_ratio" not in samples


def test_before_the_first_poll_only_build_info() -> None:
    samples = _samples(_exposition(None))
    assert set(samples) == {"vllm_sidecar_build_info"}


def test_promtool_check_metrics_is_clean() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed: .ci/run must install Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=_exposition(_busy_view()),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _acting_view(*, restarts: dict[str, int], actions: dict[str, int]) -> ActingView:
    return ActingView(
        state="normal",
        states=("normal", "paused"),
        admission_paused=False,
        ready=True,
        readiness_reason="admitting",
        decision_reason="ok",
        would_restart_but=None,
        cooldown_remaining_s=None,
        restarts_in_budget_window=0,
        restart_budget_remaining=3,
        last_restart_wall_time_s=None,
        dry_run=False,
        actuator="none",
        action_kinds=("drain", "restart"),
        failure_kinds=("restart",),
        restart_reasons=("engine_dead", "engine_hung"),
        restarts=restarts,
        actions=actions,
    )


def test_counters_exist_at_zero_before_their_first_event() -> None:
    # increase() in an alert rule cannot see a series born at 1: each labelled counter must start at 0.
    registry = CollectorRegistry(auto_describe=False)
    acting = _acting_view(restarts={"engine_hung": 2}, actions={"custom": 1})
    registry.register(SidecarCollector(version="9.9.9", latest_view=lambda: None, acting_view=lambda: acting))
    samples = _samples(generate_latest(registry).decode())
    assert {s[0]["reason"]: s[1] for s in samples["vllm_sidecar_restarts_total"]} == {
        "engine_dead": 0.0,
        "engine_hung": 2.0,
    }
    assert {s[0]["action"]: s[1] for s in samples["vllm_sidecar_actions_total"]} == {
        "custom": 1.0,
        "drain": 0.0,
        "restart": 0.0,
    }
    assert {s[0]["action"]: s[1] for s in samples["vllm_sidecar_action_failures_total"]} == {"restart": 0.0}
