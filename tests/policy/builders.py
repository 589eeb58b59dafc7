"""Small builders for policy inputs and a replay runner, so each test states only what it is about."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sidecar.model.derived import Derived, EngineDerived, GpuDerived
from sidecar.policy import (
    Decision,
    ManualAction,
    Observation,
    Policy,
    PolicySettings,
    ProcedureEvent,
    RestartLedger,
)
from sidecar.policy.probe import ProbeOutcome

GIB = 2**30
WALL0 = 1_750_000_000.0  # the wall clock at monotonic 0 in every series, unless a test moves it


def engine(
    *,
    usage: float | None = 0.5,
    running: float | None = 4.0,
    waiting: float | None = 0.0,
    preemptions_per_s: float | None = 0.0,
    stalled_s: float | None = 0.0,
    quiet_s: float | None = None,
    name: str = "0",
    model: str = "m",
    waiting_capacity: float | None = None,
    waiting_deferred: float | None = None,
    healthy: bool | None = None,
    unhealthy_s: float | None = None,
    generated_tokens: float | None = None,
) -> EngineDerived:
    return EngineDerived(
        model_name=model,
        engine=name,
        requests_running=running,
        requests_waiting=waiting,
        kv_cache_usage_ratio=usage,
        kv_cache_capacity_blocks=1000,
        kv_cache_block_size_tokens=16,
        kv_cache_used_blocks=None if usage is None else usage * 1000,
        kv_cache_blocks_per_request=None,
        kv_cache_request_headroom=None,
        kv_cache_fragmentation_ratio=None,
        prefix_cache_hit_ratio=None,
        prefix_cache_hit_ratio_lifetime=None,
        preemptions_per_second=preemptions_per_s,
        engine_stalled_seconds=stalled_s,
        seconds_since_progress=quiet_s,
        requests_waiting_capacity=waiting_capacity,
        requests_waiting_deferred=waiting_deferred,
        engine_healthy=healthy,
        engine_unhealthy_seconds=unhealthy_s,
        generation_tokens_total=generated_tokens,
    )


def gpu(index: int = 0, *, free_ratio: float = 0.3, time_to_oom_s: float | None = None) -> GpuDerived:
    total = 80 * GIB
    free = int(total * free_ratio)
    return GpuDerived(
        gpu=index,
        memory_total_bytes=total,
        memory_used_bytes=total - free,
        memory_free_bytes=free,
        memory_budget_bytes=int(total * 0.9),
        memory_over_budget_bytes=None,
        memory_growth_bytes_per_second=None if time_to_oom_s is None else free / time_to_oom_s,
        memory_growth_fit_r2=None if time_to_oom_s is None else 0.95,
        time_to_oom_seconds=time_to_oom_s,
        vllm_process_memory_bytes=None,
        other_process_memory_bytes=None,
        unknown_process_memory_bytes=None,
        utilization_ratio=None,
        temperature_celsius=None,
        xid_errors_total=None,
        last_xid=None,
    )


def obs(
    t: float,
    *engines: EngineDerived,
    gpus: tuple[GpuDerived, ...] = (),
    healthy: bool | None = True,
    poll_ok: bool = True,
    age_s: float | None = 0.0,
    wall_s: float | None = None,
) -> Observation:
    """One tick at monotonic `t`; one default engine unless engines are given."""
    return Observation(
        now_s=t,
        wall_time_s=WALL0 + t if wall_s is None else wall_s,
        poll_ok=poll_ok,
        vllm_healthy=healthy,
        data_age_s=age_s,
        derived=Derived(engines=engines or (engine(),), gpus=gpus, problems=()),
    )


def down(t: float, *, since_poll_s: float | None, health: bool | None = False) -> Observation:
    """A tick where vLLM could not be polled (its last values are `since_poll_s` old)."""
    return obs(t, healthy=health, poll_ok=False, age_s=since_poll_s)


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    event: ProcedureEvent
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Manual:
    t: float
    action: ManualAction


@dataclass(frozen=True, slots=True)
class Probe:
    """The engine probe's answer, as the shell reports it."""

    t: float
    outcome: ProbeOutcome
    detail: str = ""


Step = Observation | Event | Manual | Probe
Row = tuple[float, str, tuple[str, ...]]


def no_probe(**overrides: Any) -> PolicySettings:
    """Settings with the engine probe off (--probe-after 0): a hung engine is judged on its stall alone. The
    probe has its own replays (test_probe.py); the others need not answer it."""
    return PolicySettings(**{"probe_after_s": 0.0, **overrides})


class Replay:
    """Feeds a series through one Policy, keeping the ledger the way the shell would. Without settings, the
    defaults with the engine probe off (`no_probe`)."""

    def __init__(self, settings: PolicySettings | None = None, ledger: RestartLedger | None = None) -> None:
        self.policy = Policy(settings if settings is not None else no_probe())
        self.ledger = ledger or RestartLedger()
        self.decisions: list[Decision] = []

    def step(self, item: Step) -> Decision:
        if isinstance(item, Observation):
            decision = self.policy.decide(item, self.ledger)
        elif isinstance(item, Probe):
            decision = self.policy.probe_event(item.outcome, item.t, WALL0 + item.t, self.ledger, item.detail)
        elif isinstance(item, Event):
            decision, self.ledger = self.policy.procedure_event(
                item.event, item.t, WALL0 + item.t, self.ledger, item.detail
            )
        else:
            decision = self.policy.manual(item.action, item.t, WALL0 + item.t, self.ledger)
        self.decisions.append(decision)
        return decision

    def at(self, t: float) -> Decision:
        """The last decision taken at monotonic time `t`."""
        return next(d for d in reversed(self.decisions) if d.now_s == t)

    def run(self, items: Iterable[Step]) -> list[Row]:
        """Every step where the state changed or an action was taken: (t, state, action kinds)."""
        rows: list[Row] = []
        for item in items:
            decision = self.step(item)
            if decision.actions or decision.state != decision.previous_state:
                rows.append((decision.now_s, decision.state.value, tuple(a.kind.value for a in decision.actions)))
        return rows


def ticks(start: float, stop: float, every: float = 2.0) -> list[float]:
    """Tick times from start up to and including stop."""
    count = round((stop - start) / every)
    return [start + i * every for i in range(count + 1)]
