"""Show a registry the way prometheus_client's multiprocess collector shows it, as vLLM 0.6.x serves it. No I/O.

vLLM 0.6.x runs the engine in its own process and serves /metrics from a `PROMETHEUS_MULTIPROC_DIR`
registry. Switching the real multiprocess mode on is process-wide (an environment variable read by
prometheus_client), so the simulator keeps an ordinary registry and rewrites what it collects into what
`MultiProcessCollector` would give: no `_created` series (V0 also calls `disable_created_metrics()`),
no family that has no series yet, and histograms listed as `_sum`, buckets, `_count` per label set.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


class MultiprocessView:
    """A collector over `source` that drops `_created` and empty families and orders histogram samples."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            created = family.name + "_created"
            samples = [sample for sample in family.samples if sample.name != created]
            if not samples:
                continue
            view = Metric(family.name, family.documentation, family.type)
            view.samples = _multiprocess_order(family.name, samples) if family.type == "histogram" else samples
            yield view


def _multiprocess_order(name: str, samples: list[Sample]) -> list[Sample]:
    groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for sample in samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        groups.setdefault(key, []).append(sample)
    ordered: list[Sample] = []
    for group in groups.values():
        ordered.extend(sample for sample in group if sample.name == name + "_sum")
        ordered.extend(sample for sample in group if sample.name == name + "_bucket")
        ordered.extend(sample for sample in group if sample.name == name + "_count")
    return ordered
