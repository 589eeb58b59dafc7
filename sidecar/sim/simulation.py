"""The simulated vLLM server: its engines (one per GPU), their GPUs and the scenario. Pure and synchronous.

The caller owns the clock: every method that depends on time takes `now_s`, and `step(now_s)` says how long the
step takes. Scenario times count from the first call that passes a time (`tenant_start_s`, `hang_queue_after_s`,
`hang_idle_after_s`) or from the first request (`hang_after_s`). Log lines are stamped with
`now_s + config.wall_offset_s`.

Three wedges, none of which `/health` shows: `hang_after_s` stops the engine with requests running;
`hang_queue_after_s` stops the scheduler admitting (requests wait with 0 running, the engine loop and its gauges
live on); `hang_idle_after_s` stops the engine at an idle moment. A stopped engine publishes no more stats, so
`engine_gauges` then repeats what it last published.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.sim.config import SimConfig
from sidecar.sim.engine import Engine, check_request
from sidecar.sim.logs import death_lines, kv_capacity_lines, refusal_lines, refusal_message
from sidecar.sim.memory import GpuMemory, OutOfMemory
from sidecar.sim.records import Death, DeathCause, EngineGauges, GpuState, Recorder, StepOutcome, TokenEvent
from sidecar.sim.scenarios import admits, is_hung, stops_when_idle, tenant_wanted_bytes

HUNG_UTILIZATION_RATIO = 1.0  # a stuck collective or kernel spins: NVML shows the GPU busy while nothing advances
STOPPED_UTILIZATION_RATIO = 0.0  # a stopped (SIGSTOPped) idle engine runs no kernel


class EngineDeadError(RuntimeError):
    """The engine died or never started: vLLM answers every request with an error."""


class QueueOverflowError(RuntimeError):
    """Admitting the request would exceed --max-num-queued-reqs: vLLM answers 503 and counts the rejection."""

    reason = "max_num_queued_reqs"  # the `reason` label of vllm:admission_rejections_total
    # vLLM 0.32's QueueOverflowError message (vllm/exceptions.py).
    message = (
        "The engine is currently busy and cannot accept new requests. "
        "Please try again later or on a different instance."
    )


class Simulation:
    def __init__(self, config: SimConfig, recorder: Recorder) -> None:
        self.config = config
        blocks = config.derived_num_gpu_blocks
        self._refusal = refusal_message(config, blocks)
        # A refused start still gets a (tiny) pool so the object is whole; it never runs.
        pool_blocks = max(2, blocks)
        self._engines = [
            Engine(config=config, index=index, recorder=recorder, num_gpu_blocks=pool_blocks)
            for index in range(config.data_parallel)
        ]
        self._gpus = [
            GpuMemory(config=config, index=index, kv_pool_bytes=blocks * config.block_bytes)
            for index in range(config.data_parallel)
        ]
        self._finished = [0] * config.data_parallel  # requests finished since the GPU last stepped (leak)
        self._route: dict[str, int] = {}
        self._origin_s: float | None = None
        self._first_request_s: float | None = None
        self._next_engine = 0
        self.death: Death | None = None
        self.hung = False
        self.stopped_idle = False  # hang_idle_after_s: the engine stopped at an idle moment
        self._published: tuple[EngineGauges, ...] | None = None  # the last stats a stopped engine published

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks of each engine."""
        return self.config.derived_num_gpu_blocks

    @property
    def has_work(self) -> bool:
        return any(engine.has_work for engine in self._engines)

    @property
    def in_flight(self) -> int:
        """Sequences waiting or running on every engine: what vLLM's API server counts against its queue cap."""
        return sum(engine.load for engine in self._engines)

    @property
    def alive(self) -> bool:
        return self._refusal is None and self.death is None

    def startup_check(self, now_s: float = 0.0) -> tuple[str, ...] | None:
        """vLLM's refusal to start (log lines ending in its ValueError), or None when it starts."""
        if self._refusal is None:
            return None
        return refusal_lines(self.config, self._refusal, self.num_gpu_blocks, now_s + self.config.wall_offset_s)

    def startup_log(self, now_s: float = 0.0) -> tuple[str, ...]:
        """The KV capacity lines a real vLLM prints at start (the refusal instead when it does not start)."""
        refusal = self.startup_check(now_s)
        if refusal is not None:
            return refusal
        wall_s = now_s + self.config.wall_offset_s
        total = self.num_gpu_blocks * self.config.data_parallel
        lines: list[str] = []
        for engine in self._engines:
            lines.extend(kv_capacity_lines(self.config, engine.index, self.num_gpu_blocks, total, wall_s))
        return tuple(lines)

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int, now_s: float, n: int = 1
    ) -> int:
        """Queue a request on the least-loaded engine and return that engine's index.

        Raises RequestRejectedError (vLLM's HTTP 400 message), EngineDeadError, QueueOverflowError (vLLM's 503 of
        `max_num_queued_reqs`), or ValueError for a duplicate id.
        """
        self._touch(now_s)
        if self._refusal is not None:
            raise EngineDeadError("the engine never started")
        if self.death is not None:
            raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        check_request(self.config, prompt_token_ids, max_tokens, n)
        if request_id in self._route:
            raise ValueError(f"Request id {request_id} already running.")
        cap = self.config.max_num_queued_reqs
        if cap is not None and self.in_flight + n > cap:  # AsyncLLM.check_admission: a request with n counts n
            raise QueueOverflowError(QueueOverflowError.message)
        count = len(self._engines)
        # Least loaded first; ties go round robin so equal engines share the work.
        engine = min(self._engines, key=lambda e: (e.load, (e.index - self._next_engine) % count))
        self._next_engine = (engine.index + 1) % count
        engine.add_request(request_id, prompt_token_ids, max_tokens, now_s, n)
        self._route[request_id] = engine.index
        if self._first_request_s is None:
            self._first_request_s = now_s
        return engine.index

    def abort(self, request_id: str, now_s: float) -> bool:
        """Abort a request; False when unknown, or when the engine is hung or dead and processes nothing."""
        self._touch(now_s)
        if not self.alive or self.hung or request_id not in self._route:
            return False
        return self._engines[self._route.pop(request_id)].abort(request_id, now_s)

    def step(self, now_s: float) -> StepOutcome:
        """One step of every engine; the outcome of the slowest. Reports a death once, in the step it happens."""
        self._touch(now_s)
        idle_s = self.config.decode_step_s
        self._update_tenants(now_s)
        if not self.alive:
            for gpu in self._gpus:
                gpu.idle(now_s, utilization_ratio=0.0)
            return StepOutcome(duration_s=idle_s)
        elapsed_s = now_s - (now_s if self._origin_s is None else self._origin_s)
        if not self.hung and not self.has_work and stops_when_idle(self.config, elapsed_s):
            self.stopped_idle = True
        self.hung = self.stopped_idle or is_hung(self.config, self._first_request_s, now_s)
        if self.hung:
            if self._published is None:
                self._published = self.engine_gauges()
            utilization = STOPPED_UTILIZATION_RATIO if self.stopped_idle else HUNG_UTILIZATION_RATIO
            for gpu in self._gpus:
                gpu.idle(now_s, utilization_ratio=utilization)
            return StepOutcome(duration_s=idle_s, hung=True)
        for engine in self._engines:
            engine.admitting = admits(self.config, elapsed_s)
        batches = [engine.schedule() for engine in self._engines]
        for engine, gpu, batch in zip(self._engines, self._gpus, batches, strict=True):
            activation = gpu.activation_bytes(
                scheduled_tokens=batch.scheduled_tokens, context_tokens=batch.context_tokens
            )
            oom = gpu.advance(
                now_s,
                activation_bytes=activation,
                finished_requests=self._finished[engine.index],
                busy_tokens=batch.scheduled_tokens,
            )
            self._finished[engine.index] = 0
            if oom is not None:
                return self._die(engine.index, oom, now_s)
        duration_s = idle_s
        tokens: list[TokenEvent] = []
        for engine, batch in zip(self._engines, batches, strict=True):
            outcome = engine.execute(batch, now_s)
            duration_s = max(duration_s, outcome.duration_s)
            tokens.extend(outcome.tokens)
            for event in outcome.tokens:
                if event.finished is not None:
                    self._finished[engine.index] += 1
                    self._route.pop(event.request_id, None)
        extra = {f"gpu{gpu.index}_activation_bytes": float(gpu.activation_live_bytes) for gpu in self._gpus}
        return StepOutcome(duration_s=duration_s, tokens=tuple(tokens), extra=extra)

    def gpu_states(self, now_s: float) -> tuple[GpuState, ...]:
        """Every simulated GPU as NVML would report it now."""
        self._touch(now_s)
        self._update_tenants(now_s)
        return tuple(gpu.state() for gpu in self._gpus)

    def engine_gauges(self) -> tuple[EngineGauges, ...]:
        """What the engines publish; a stopped engine's last stats (it publishes nothing new)."""
        if self._published is not None:
            return self._published
        return tuple(engine.gauges() for engine in self._engines)

    @property
    def admitting(self) -> bool:
        """False once the scheduler stopped admitting (`hang_queue_after_s`)."""
        return all(engine.admitting for engine in self._engines)

    def _touch(self, now_s: float) -> None:
        if self._origin_s is None:
            self._origin_s = now_s

    def _update_tenants(self, now_s: float) -> None:
        origin = now_s if self._origin_s is None else self._origin_s
        wanted = tenant_wanted_bytes(self.config, now_s - origin)
        for gpu in self._gpus:
            gpu.set_tenant(wanted)

    def _die(self, engine: int, oom: OutOfMemory, now_s: float) -> StepOutcome:
        lines = death_lines(self.config, engine, oom, now_s + self.config.wall_offset_s)
        self.death = Death(cause=DeathCause.CUDA_OOM, engine=engine, log_lines=lines)
        return StepOutcome(duration_s=self.config.decode_step_s, death=self.death)
