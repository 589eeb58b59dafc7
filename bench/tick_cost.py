"""In-process cost of the parser and of one tick's pure work, against prometheus_client on the same bytes.

Pure CPU work, no I/O. Every contender runs once per round, interleaved, with the same clock in the same
process, so a busy machine slows all of them alike: the ratios are what to read, the milliseconds depend on
the machine. The values are compared before any speed is reported (`values_identical`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.gpu import GpuDevice, GpuProcess, GpuReading, ProcessOwner
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.parse.exposition import parse_exposition
from sidecar.parse.pick import SamplePicker
from sidecar.parse.vllm import KEPT_SAMPLES, read_vllm, vllm_sample_picker

Flat = list[tuple[str, tuple[tuple[str, str], ...], str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParserSpeed:
    size_bytes: int
    reference_ms: float  # prometheus_client.parser, full parse (all it can do)
    full_ms: float  # our parser keeping every sample
    filtered_ms: float  # our parser keeping KEPT_SAMPLES, every other line's shape checked (the doctor's)
    tick_ms: float  # the daemon's tick: the picker, KEPT_SAMPLES parsed, other lines not read
    full_identical: bool  # every sample equal to the reference's
    filtered_identical: bool  # the kept samples equal to the reference's samples of those names
    tick_identical: bool  # the same, for the picker

    @property
    def values_identical(self) -> bool:
        return self.full_identical and self.filtered_identical and self.tick_identical


def _timed_rounds(contenders: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median milliseconds of each contender, each run once per round, in turn."""
    samples: list[list[float]] = [[] for _ in contenders]
    for _ in range(repeats):
        for index, run in enumerate(contenders):
            started = time.perf_counter()
            run()
            samples[index].append((time.perf_counter() - started) * 1000)
    return [statistics.median(values) for values in samples]


def _normal(rows: list[tuple[str, tuple[tuple[str, str], ...], float]]) -> Flat:
    # repr keeps every bit of a float; NaN is spelled out since NaN != NaN.
    return sorted((name, labels, "nan" if math.isnan(value) else repr(value)) for name, labels, value in rows)


def reference_values(text: str, keep: Collection[str] | None = None) -> Flat:
    return _normal(
        [
            (sample.name, tuple(sorted(sample.labels.items())), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if keep is None or sample.name in keep
        ]
    )


def our_values(text: str, keep: Collection[str] | None = None, *, picker: SamplePicker | None = None) -> Flat:
    exposition = picker.pick(text) if picker is not None else parse_exposition(text, keep)
    return _normal(
        [
            (sample.name, tuple(sorted(sample.labels)), sample.value)
            for samples in exposition.samples.values()
            for sample in samples
        ]
    )


def measure_parser(text: str, *, repeats: int = 15) -> ParserSpeed:
    """The picker is one per daemon, kept between ticks: its first pick (label sets not yet remembered) is
    part of the identity check, not of the timing, as a daemon's first tick is not of its steady state."""
    picker = vllm_sample_picker()
    reference = reference_values(text, KEPT_SAMPLES)
    first_pick_identical = our_values(text, picker=picker) == reference
    reference_ms, full_ms, filtered_ms, tick_ms = _timed_rounds(
        [
            lambda: list(text_string_to_metric_families(text)),
            lambda: parse_exposition(text),
            lambda: parse_exposition(text, KEPT_SAMPLES),
            lambda: picker.pick(text),
        ],
        repeats,
    )
    return ParserSpeed(
        size_bytes=len(text.encode()),
        reference_ms=reference_ms,
        full_ms=full_ms,
        filtered_ms=filtered_ms,
        tick_ms=tick_ms,
        full_identical=our_values(text) == reference_values(text),
        filtered_identical=our_values(text, KEPT_SAMPLES) == reference,
        tick_identical=first_pick_identical and our_values(text, picker=picker) == reference,
    )


def gpu_reading(gpus: int, used_bytes: int) -> GpuReading:
    """`gpus` H100s with vLLM on each, as the NVML or simulator source would report them."""
    return GpuReading(
        devices=tuple(
            GpuDevice(
                index=index,
                uuid=f"GPU-{index:08d}",
                name="NVIDIA H100 80GB HBM3",
                memory_total_bytes=80 * 2**30,
                memory_used_bytes=used_bytes,
                memory_free_bytes=80 * 2**30 - used_bytes,
                utilization_ratio=0.5,
                temperature_celsius=60.0,
                processes=(
                    GpuProcess(
                        pid=4242 + index, used_memory_bytes=used_bytes, name="VLLM::Worker", owner=ProcessOwner.VLLM
                    ),
                ),
                xid_errors_total=0,
                last_xid=None,
            )
            for index in range(gpus)
        ),
        driver_version="570.00",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TickWork:
    window_snapshots: int
    reference_ms: float  # one prometheus_client parse of the same bytes
    tick_ms: float  # the picker + vLLM reading + derive over a full window


def measure_tick(text: str, *, interval_s: float, gpus: int = 0, repeats: int = 15) -> TickWork:
    """One tick's pure work with the window as full as a daemon's after `span_s` of running at `interval_s`."""
    settings = DeriveSettings()
    window = Window(span_s=settings.span_s)
    deriver = Deriver(settings)
    clock = [0.0]
    ticks = [0]

    picker = vllm_sample_picker()
    first = read_vllm(picker.pick(text), url="http://vllm", version="0.32.0")
    fill = int(settings.span_s / interval_s) + 1
    # What the GPU source would hand over each tick, made beforehand: building them is not the tick's work.
    readings = [
        SourceResult(source="gpu", duration_s=0.0, value=gpu_reading(gpus, 60 * 2**30 + 1_000_000 * tick))
        for tick in range(fill + 4 * repeats)
    ]

    def one_tick(parse: bool = True, derive: bool = True) -> None:
        reading = first
        if parse:
            reading = read_vllm(picker.pick(text), url="http://vllm", version="0.32.0")
        clock[0] += interval_s
        # A slow, steady growth of GPU memory: the trend fit has a line to find.
        gpu = readings[ticks[0] % len(readings)] if gpus else None
        ticks[0] += 1
        window.push(
            Snapshot(
                monotonic_s=clock[0],
                wall_time_s=clock[0],
                vllm=SourceResult(source="vllm", duration_s=0.0, value=reading),
                vllm_healthy=True,
                gpu=gpu,
            )
        )
        if derive:
            deriver.derive(window)

    for _ in range(fill):
        one_tick(parse=False, derive=False)  # filling the window needs neither parsing nor deriving
    reference_ms, tick_ms = _timed_rounds([lambda: list(text_string_to_metric_families(text)), one_tick], repeats)
    return TickWork(window_snapshots=len(window), reference_ms=reference_ms, tick_ms=tick_ms)
