"""Growth: how one tick's pure work grows with the exposition (engines) and with the GPUs watched. Pure CPU.

Measured in-process with the window as full as it gets at a 1 s interval (600 snapshots for the default
10 min memory-trend window), the costliest steady state; the daemon suite gives the whole-process numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.generate_exposition import generate_exposition
from bench.tick_cost import measure_tick

ENGINES = (1, 2, 4, 8, 16)
GPUS = (1, 2, 4, 8)
INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GrowthRow:
    engines: int
    gpus: int
    size_bytes: int
    window_snapshots: int
    reference_ms: float
    tick_ms: float


def measure_growth(*, repeats: int = 10) -> list[GrowthRow]:
    rows = []
    texts = {engines: generate_exposition(engines=engines) for engines in ENGINES}
    # Engines alone (no GPU source), then one engine per GPU as data parallelism runs them.
    for engines, gpus in [(engines, 0) for engines in ENGINES] + [(gpus, gpus) for gpus in GPUS]:
        text = texts[engines]
        work = measure_tick(text, interval_s=INTERVAL_S, gpus=gpus, repeats=repeats)
        rows.append(
            GrowthRow(
                engines=engines,
                gpus=gpus,
                size_bytes=len(text.encode()),
                window_snapshots=work.window_snapshots,
                reference_ms=work.reference_ms,
                tick_ms=work.tick_ms,
            )
        )
    return rows
