"""The expositions every benchmark measures on, and the simulator's 8-GPU server. Pure CPU work, no I/O.

The issue's sizes: about 50 KB (one engine with every histogram: 66 KB is the least a vLLM 0.32 engine
writes), 300 KB (4 engines) and 1 MB (8 engines), the last two filled up with `vllm:lora_requests_info`
series, which is what many LoRA adapters add (vLLM keeps one series per running/waiting combination seen).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from bench.generate_exposition import generate_exposition
from sidecar.sim.config import SimConfig
from sidecar.sim.server import metrics_writer
from sidecar.sim.simulation import Simulation


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposition:
    label: str
    engines: int
    lora_series: int
    text: str

    @property
    def size_bytes(self) -> int:
        return len(self.text.encode())

    @property
    def size_text(self) -> str:
        size = self.size_bytes
        return f"{size / 1024:.0f} KiB" if size < 1024 * 1024 else f"{size / 2**20:.2f} MiB"

    @property
    def lines(self) -> int:
        return self.text.count("\n")


def _lora_series_for(engines: int, target_bytes: int) -> int:
    """The number of LoRA series that brings `engines` engines' exposition closest to `target_bytes`."""
    base = len(generate_exposition(engines=engines).encode())
    if base >= target_bytes:
        return 0
    # The LoRA family does not depend on the engines: size it on the cheapest exposition, by bisection.
    single = len(generate_exposition(engines=1).encode())
    low, high = 0, 4096
    while low < high:
        middle = (low + high) // 2
        grown = len(generate_exposition(engines=1, lora_adapters=middle).encode()) - single
        if base + grown < target_bytes:
            low = middle + 1
        else:
            high = middle
    return low


def sized_exposition(label: str, *, engines: int, target_bytes: int | None = None) -> Exposition:
    lora = 0 if target_bytes is None else _lora_series_for(engines, target_bytes)
    text = generate_exposition(engines=engines, lora_adapters=lora)
    return Exposition(label=label, engines=engines, lora_series=lora, text=text)


def standard_expositions() -> list[Exposition]:
    """The three sizes of the issue: ~50 KB (1 engine), ~300 KB (4 engines), ~1 MB (8 engines)."""
    return [
        sized_exposition("50 KB", engines=1),
        sized_exposition("300 KB", engines=4, target_bytes=300 * 1000),
        sized_exposition("1 MB", engines=8, target_bytes=1000 * 1000),
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedServer:
    """What `vllm-sidecar sim --data-parallel N` serves at /metrics and /sim/gpu, made by the simulator's code."""

    gpus: int
    metrics: bytes
    gpu_document: bytes


def simulated_server(gpus: int, now_s: float = 30.0) -> SimulatedServer:
    config = SimConfig(data_parallel=gpus)
    # The same wiring as sidecar.sim.server.SimServer, without its HTTP server and engine loop.
    writer = metrics_writer(config)
    simulation = Simulation(config, writer)
    simulation.step(0.0)
    document = json.dumps({"gpus": [asdict(state) for state in simulation.gpu_states(now_s)]}).encode()
    return SimulatedServer(gpus=gpus, metrics=writer.render(simulation.engine_gauges()), gpu_document=document)
