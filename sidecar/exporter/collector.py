"""A prometheus_client collector that yields fresh metric families from the latest view. No I/O.

Fresh families on every scrape (rather than long-lived Gauge objects) mean an engine or GPU that went
away leaves no stale series behind, and a scrape always sees one consistent tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.exporter import names
from sidecar.exporter.names import Kind, MetricSpec
from sidecar.model.acting import ActingView
from sidecar.model.derived import AllocatorDerived
from sidecar.model.gpu import ProcessOwner
from sidecar.model.remediation import OUTCOMES, StepState
from sidecar.model.snapshot import Snapshot
from sidecar.model.view import View

_Family = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily


def _family(spec: MetricSpec) -> _Family:
    if spec.kind is Kind.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    if spec.kind is Kind.INFO:
        return InfoMetricFamily(spec.name, spec.help, labels=())
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


class SidecarCollector(Collector):
    def __init__(
        self,
        *,
        version: str,
        latest_view: Callable[[], View | None],
        acting_view: Callable[[], ActingView | None] = lambda: None,
    ) -> None:
        self._version = version
        self._latest_view = latest_view
        self._acting_view = acting_view

    def collect(self) -> Iterator[Metric]:
        acting = self._acting_view()
        specs = (*names.ALL, *names.POLICY) if acting is not None else names.ALL
        families = {spec.name: _family(spec) for spec in specs}

        def add(spec: MetricSpec, value: float | None, *label_values: str) -> None:
            if value is None:
                return  # absent, never a made-up 0
            family = families[spec.name]
            assert isinstance(family, GaugeMetricFamily | CounterMetricFamily)  # noqa: S101 - programming error
            family.add_metric(list(label_values), value)

        build = families[names.BUILD_INFO.name]
        assert isinstance(build, InfoMetricFamily)  # noqa: S101 - programming error
        build.add_metric([], {"version": self._version})
        view = self._latest_view()
        if view is not None:
            self._add_view(view, add, families)
        if acting is not None:
            _add_acting(acting, add)
        yield from families.values()

    def _add_view(self, view: View, add: Callable[..., None], families: dict[str, _Family]) -> None:
        snapshot, derived = view.snapshot, view.derived
        add(names.UP, 1.0 if snapshot.vllm.ok else 0.0)
        _add_sources(snapshot, add)
        add(names.LAST_POLL, snapshot.wall_time_s)
        if snapshot.vllm_healthy is not None:
            add(names.VLLM_HEALTHY, 1.0 if snapshot.vllm_healthy else 0.0)
        add(names.PROBLEMS, float(len(derived.problems)))
        reading = snapshot.vllm.value
        if reading is not None and snapshot.vllm.ok:
            info = families[names.VLLM_INFO.name]
            assert isinstance(info, InfoMetricFamily)  # noqa: S101 - programming error
            info.add_metric([], {"version": reading.version or "", "metric_schema": reading.schema.value})
        for engine in derived.engines:
            labels = (engine.model_name, engine.engine)
            add(names.KV_USAGE, engine.kv_cache_usage_ratio, *labels)
            add(names.KV_CAPACITY, engine.kv_cache_capacity_blocks, *labels)
            add(names.KV_CAPACITY_TOKENS, engine.kv_cache_capacity_tokens, *labels)
            add(names.KV_BLOCK_SIZE, engine.kv_cache_block_size_tokens, *labels)
            add(names.KV_USED, engine.kv_cache_used_blocks, *labels)
            add(names.KV_PER_REQUEST, engine.kv_cache_blocks_per_request, *labels)
            add(names.KV_HEADROOM, engine.kv_cache_request_headroom, *labels)
            add(names.KV_FRAGMENTATION, engine.kv_cache_fragmentation_ratio, *labels)
            add(names.PREFIX_HIT_RATIO, engine.prefix_cache_hit_ratio, *labels)
            add(names.ENGINE_STALLED, engine.engine_stalled_seconds, *labels)
            add(names.PREEMPTIONS_RATE, engine.preemptions_per_second, *labels)
            add(names.PREEMPTIONS_IN_WINDOW, engine.preemptions_in_window, *labels)
            add(names.WAITING_DEFERRED_RATIO, engine.requests_waiting_deferred_ratio, *labels)
            add(names.ENGINE_UNHEALTHY, engine.engine_unhealthy_seconds, *labels)
        for model in derived.models:
            add(names.VLLM_REJECTIONS_RATE, model.admission_rejections_per_second, model.model_name)
            add(names.VLLM_REJECTIONS_IN_WINDOW, model.admission_rejections_in_window, model.model_name)
        for gpu in derived.gpus:
            index = str(gpu.gpu)
            add(names.GPU_TOTAL, gpu.memory_total_bytes, index)
            add(names.GPU_USED, gpu.memory_used_bytes, index)
            add(names.GPU_BUDGET, gpu.memory_budget_bytes, index)
            add(names.GPU_OVER_BUDGET, gpu.memory_over_budget_bytes, index)
            add(names.GPU_GROWTH, gpu.memory_growth_bytes_per_second, index)
            add(names.GPU_TIME_TO_OOM, gpu.time_to_oom_seconds, index)
            add(names.GPU_PROCESS_MEMORY, gpu.vllm_process_memory_bytes, index, ProcessOwner.VLLM.value)
            add(names.GPU_PROCESS_MEMORY, gpu.other_process_memory_bytes, index, ProcessOwner.OTHER.value)
            add(names.GPU_PROCESS_MEMORY, gpu.unknown_process_memory_bytes, index, ProcessOwner.UNKNOWN.value)
            add(names.GPU_UTILIZATION, gpu.utilization_ratio, index)
            add(names.GPU_TEMPERATURE, gpu.temperature_celsius, index)
            add(names.GPU_XID, gpu.xid_errors_total, index)
            add(names.GPU_LAST_XID, gpu.last_xid, index)
        _add_allocators(derived.allocators, add)


def _add_sources(snapshot: Snapshot, add: Callable[..., None]) -> None:
    add(names.SOURCE_SUCCESS, 1.0 if snapshot.vllm.ok else 0.0, snapshot.vllm.source)
    add(names.SOURCE_DURATION, snapshot.vllm.duration_s, snapshot.vllm.source)
    if snapshot.gpu is not None:
        add(names.SOURCE_SUCCESS, 1.0 if snapshot.gpu.ok else 0.0, snapshot.gpu.source)
        add(names.SOURCE_DURATION, snapshot.gpu.duration_s, snapshot.gpu.source)
    if snapshot.allocator is not None:
        # 1 only when every file was fresh and well formed: a stale file is a failing source, never a value.
        whole = snapshot.allocator.value is not None and not snapshot.allocator.value.problems
        add(names.SOURCE_SUCCESS, 1.0 if snapshot.allocator.ok and whole else 0.0, snapshot.allocator.source)
        add(names.SOURCE_DURATION, snapshot.allocator.duration_s, snapshot.allocator.source)


def _add_allocators(allocators: tuple[AllocatorDerived, ...], add: Callable[..., None]) -> None:
    for allocator in allocators:
        labels = (str(allocator.gpu), allocator.rank)
        add(names.TORCH_ALLOCATED, allocator.allocated_bytes, *labels)
        add(names.TORCH_RESERVED, allocator.reserved_bytes, *labels)
        add(names.TORCH_INACTIVE_SPLIT, allocator.inactive_split_bytes, *labels)
        add(names.TORCH_FRAGMENTATION, allocator.fragmentation_ratio, *labels)
        add(names.TORCH_ALLOC_RETRIES, allocator.alloc_retries_total, *labels)
        add(names.TORCH_OOMS, allocator.ooms_total, *labels)


def _add_acting(acting: ActingView, add: Callable[..., None]) -> None:
    add(names.ADMISSION_PAUSED, 1.0 if acting.admission_paused else 0.0)
    add(names.READY, 1.0 if acting.ready else 0.0)
    for state in acting.states:
        add(names.POLICY_STATE, 1.0 if state == acting.state else 0.0, state)
    for action in sorted({*acting.action_kinds, *acting.actions}):
        add(names.ACTIONS, float(acting.actions.get(action, 0)), action)
    for action in sorted({*acting.failure_kinds, *acting.failures}):
        add(names.ACTION_FAILURES, float(acting.failures.get(action, 0)), action)
    for reason in sorted({*acting.restart_reasons, *acting.restarts}):
        add(names.RESTARTS, float(acting.restarts.get(reason, 0)), reason)
    add(names.LAST_RESTART, acting.last_restart_wall_time_s)
    add(names.RESTART_BUDGET_REMAINING, float(acting.restart_budget_remaining))
    for outcome in sorted({*acting.probe_outcomes, *acting.probes}):
        add(names.PROBES, float(acting.probes.get(outcome, 0)), outcome)
    for trigger in sorted({*acting.incident_triggers, *acting.incidents}):
        add(names.INCIDENTS, float(acting.incidents.get(trigger, 0)), trigger)
    for kind in sorted({*acting.incident_kinds, *acting.incident_parts_missing}):
        add(names.INCIDENT_PARTS_MISSING, float(acting.incident_parts_missing.get(kind, 0)), kind)
    remediation = acting.remediation
    if remediation is not None:
        # Every allowed flag's outcomes from 0, so increase() sees the first one.
        pairs = {(a.flag, outcome) for a in remediation.allowed for outcome in OUTCOMES}
        for flag, outcome in sorted(pairs | set(remediation.outcomes)):
            add(names.REMEDIATIONS, float(remediation.outcomes.get((flag, outcome), 0)), flag, outcome)
        add(names.REMEDIATION_PENDING, 1.0 if any(s.state is StepState.PENDING for s in remediation.steps) else 0.0)
        for flag, value in sorted(remediation.flags.items()):
            add(names.REMEDIATION_FLAG_VALUE, value, flag)
