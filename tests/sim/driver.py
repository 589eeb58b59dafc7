"""Test helpers: a recorder that keeps everything, and a fake-clock loop driving a simulation with a closed load."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.sim.config import SimConfig
from sidecar.sim.load import ClosedLoopLoad
from sidecar.sim.records import Death, FinishedRequest, StepRecord
from sidecar.sim.scenarios import LoadShape
from sidecar.sim.simulation import Simulation


@dataclass
class ListRecorder:
    steps: list[StepRecord] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)

    def step_done(self, record: StepRecord) -> None:
        self.steps.append(record)

    def request_finished(self, record: FinishedRequest) -> None:
        self.finished.append(record)

    def total(self, name: str) -> int:
        return sum(int(getattr(step, name)) for step in self.steps)

    def hit_ratio(self) -> float:
        queries = self.total("prefix_queries_tokens")
        return self.total("prefix_hits_tokens") / queries if queries else 0.0


@dataclass(frozen=True)
class Sample:
    """What a sidecar polling once a second would see."""

    t: float
    used_bytes: int
    free_bytes: int
    total_bytes: int
    running: int
    waiting: int
    kv_usage: float
    tenant_bytes: int
    generation_tokens: int
    finished: int

    @property
    def free_ratio(self) -> float:
        return self.free_bytes / self.total_bytes


@dataclass
class Run:
    sim: Simulation
    recorder: ListRecorder
    samples: list[Sample] = field(default_factory=list)
    death: Death | None = None
    death_s: float | None = None
    hung_s: float | None = None
    end_s: float = 0.0


def drive(
    config: SimConfig,
    shape: LoadShape,
    *,
    until_s: float,
    seed: int = 0,
    stop_load: object = None,
    sample_every_s: float = 1.0,
) -> Run:
    """Run the simulation on a fake clock until `until_s` or death, keeping `shape`'s concurrency in flight.

    `stop_load(sample) -> bool`, when given, is asked at each sample; once it says True no new request is sent.
    """
    recorder = ListRecorder()
    sim = Simulation(config, recorder)
    run = Run(sim=sim, recorder=recorder)
    load = ClosedLoopLoad(shape, seed=seed)
    in_flight: set[str] = set()
    sending = True
    now = 0.0
    next_sample = 0.0
    while now < until_s:
        if now >= next_sample:
            sample = _sample(sim, recorder, now)
            run.samples.append(sample)
            next_sample += sample_every_s
            if sending and callable(stop_load) and stop_load(sample):
                sending = False
        if sending:
            for request in load.due(now, len(in_flight)):
                sim.add_request(request.request_id, request.prompt_token_ids, request.max_tokens, now)
                in_flight.add(request.request_id)
        outcome = sim.step(now)
        for event in outcome.tokens:
            if event.finished is not None:
                in_flight.discard(event.request_id)
        if outcome.hung and run.hung_s is None:
            run.hung_s = now
        if outcome.death is not None:
            run.death, run.death_s = outcome.death, now
            break
        now += outcome.duration_s
    run.end_s = now
    return run


def _sample(sim: Simulation, recorder: ListRecorder, now: float) -> Sample:
    gpu = sim.gpu_states(now)[0]
    gauges = sim.engine_gauges()[0]
    tenant = sum(p.used_bytes for p in gpu.processes if not p.name.startswith("VLLM::"))
    return Sample(
        t=now,
        used_bytes=gpu.used_bytes,
        free_bytes=gpu.total_bytes - gpu.used_bytes,
        total_bytes=gpu.total_bytes,
        running=gauges.running,
        waiting=gauges.waiting,
        kv_usage=gauges.kv_usage_ratio,
        tenant_bytes=tenant,
        generation_tokens=recorder.total("generation_tokens"),
        finished=len(recorder.finished),
    )
