"""Parse + derive cost of one tick, against prometheus_client's parser on the same bytes. Pure CPU work.

Both sides get the same text and are timed with the same clock in the same process, interleaved, so a
busy machine slows both alike; the ratio is what to read, the milliseconds depend on the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.parse.exposition import parse_exposition
from sidecar.parse.vllm import KEPT_SAMPLES, read_vllm


@dataclass(frozen=True, slots=True)
class TickCost:
    size_bytes: int
    lines: int
    reference_ms: float  # prometheus_client.parser, full parse (what peers do every scrape)
    ours_full_ms: float  # our parser, every sample kept
    ours_tick_ms: float  # what the daemon does per tick: filtered parse + vLLM reading + derive over a window
    values_identical: bool


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _reference_values(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted(
        (sample.name, tuple(sorted(sample.labels.items())), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in KEPT_SAMPLES
    )


def _our_values(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    exposition = parse_exposition(text, KEPT_SAMPLES)
    return sorted(
        (sample.name, tuple(sorted(sample.labels)), sample.value)
        for samples in exposition.samples.values()
        for sample in samples
    )


def measure_tick_cost(text: str, *, repeats: int = 30, window_ticks: int = 150) -> TickCost:
    """Median cost per tick; the derive step runs over a window already holding `window_ticks` snapshots."""
    window = Window(span_s=DeriveSettings().span_s)
    deriver = Deriver(DeriveSettings())
    clock = [0.0]

    def one_tick() -> None:
        exposition = parse_exposition(text, KEPT_SAMPLES)
        reading = read_vllm(exposition, url="http://vllm", version="0.32.0")
        clock[0] += 2.0
        window.push(
            Snapshot(
                monotonic_s=clock[0],
                wall_time_s=clock[0],
                vllm=SourceResult(source="vllm", duration_s=0.0, value=reading),
                vllm_healthy=True,
                gpu=None,
            )
        )
        deriver.derive(window)

    for _ in range(window_ticks):
        one_tick()
    reference_ms = _median_ms(lambda: list(text_string_to_metric_families(text)), repeats)
    ours_full_ms = _median_ms(lambda: parse_exposition(text), repeats)
    ours_tick_ms = _median_ms(one_tick, repeats)
    return TickCost(
        size_bytes=len(text.encode()),
        lines=text.count("\n"),
        reference_ms=reference_ms,
        ours_full_ms=ours_full_ms,
        ours_tick_ms=ours_tick_ms,
        values_identical=_reference_values(text) == _our_values(text),
    )
