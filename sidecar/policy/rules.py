"""The conditions the policy acts on, evaluated on one tick's derived values. Pure.

Any engine or GPU meeting a condition is enough (the pod is one unit); clearing needs every one clear. A value
vLLM or NVML did not report cannot meet a condition and does not block clearing one: only a known number is
evidence (the policy holds everything when the data as a whole is stale or missing).

Pressure, exactly: admission is open and at least one of
- an engine's KV usage is above resume_kv_usage_ratio (inside the hysteresis band, below the pause threshold);
- an engine has waiting > waiting_ratio x running on fewer than waiting_ticks consecutive polls so far (waiting for
  capacity only, where vLLM splits its queue by reason: see `queued`);
- a GPU's forecast time to OOM is under oom_forecast_s (fewer than oom_forecast_ticks polls so far, or a guard
  blocks the restart);
- an engine made no progress with requests waiting or running for some time, still under stall_pause_after_s
  (and hung_after_s);
- a GPU's free memory is under min_gpu_free_ratio, but held by other processes with vLLM inside its budget (see
  `_held_by_others`: not a pause, which could not free it);
- a restart condition holds but a guard blocks it.

The allocator rule (allocator probe) pauses on the first retry in the short horizon and clears when the horizon
holds none: a retry is the allocator freeing its whole cache to fit a tensor, already past "partly met".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.model.derived import AllocatorDerived, Derived, EngineDerived, GpuDerived
from sidecar.model.text import gib, plural
from sidecar.policy.decision import PauseRule, RestartReason
from sidecar.policy.settings import PolicySettings


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    rule: PauseRule | None  # None: a pressure sign that is no rule's trigger yet
    text: str  # one line with the numbers


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartCause:
    reason: RestartReason
    text: str  # one line with the numbers


def engine_key(engine: EngineDerived) -> str:
    return f"{engine.model_name}/{engine.engine}"


def engine_label(engine: EngineDerived, derived: Derived) -> str:
    """'engine 0', or 'engine llama/0' when the sidecar watches engines of more than one model."""
    if len({e.model_name for e in derived.engines}) > 1:
        return f"engine {engine.model_name}/{engine.engine}"
    return f"engine {engine.engine}"


def compare(value: float, threshold: float, digits: int = 2) -> tuple[str, str]:
    """Both numbers for a reason, with enough digits that they do not print equal when they are not."""
    while digits < 6 and value != threshold and f"{value:.{digits}f}" == f"{threshold:.{digits}f}":
        digits += 1
    return f"{value:.{digits}f}", f"{threshold:.{digits}f}"


def _count(value: float) -> str:
    return f"{value:g}"


def seconds(value: float) -> str:
    """A duration for a reason line: whole seconds are precise enough for every rule here."""
    return f"{value:.0f} s"


def queued(engine: EngineDerived) -> float | None:
    """The waiting requests the queue rule counts: those waiting for scheduling capacity where vLLM splits its
    queue by reason (0.20+), all waiting requests where it does not. Deferred requests (LoRA budget, KV transfer,
    blocked) wait on something a pause does not free: more capacity elsewhere would not serve them sooner."""
    if engine.requests_waiting_capacity is not None:
        return engine.requests_waiting_capacity
    return engine.requests_waiting


def _waiting_text(engine: EngineDerived) -> str:
    """'waiting 12' (no split by reason) or 'waiting for capacity 10' (with ', 2 deferred not counted')."""
    if engine.requests_waiting_capacity is None:
        return f"waiting {_count(engine.requests_waiting or 0.0)}"
    deferred = engine.requests_waiting_deferred
    more = f" ({_count(deferred)} deferred not counted)" if deferred else ""
    return f"waiting for capacity {_count(engine.requests_waiting_capacity)}{more}"


def _waiting_exceeds(engine: EngineDerived, settings: PolicySettings) -> bool:
    waiting, running = queued(engine), engine.requests_running
    return waiting is not None and running is not None and waiting > settings.waiting_ratio * running


def _free_ratio(gpu: GpuDerived) -> float | None:
    return gpu.memory_free_bytes / gpu.memory_total_bytes if gpu.memory_total_bytes > 0 else None


def _held_by_others(gpu: GpuDerived) -> bool:
    """Whether the memory missing from `gpu` is other processes', with vLLM's own inside its budget.

    vLLM's profiler sized its KV pool and activation reserve to fit gpu_memory_utilization x total. When its
    processes hold no more than that and other processes hold memory, a pause frees none of it: it would turn
    traffic away for as long as the tenant stays (measured in bench/: the whole run). Memory of processes that
    could not be attributed (PIDs not visible from here) may be vLLM's own, so then this is not known and the
    free-memory rule pauses as it always did.
    """
    vllm, budget, others = gpu.vllm_process_memory_bytes, gpu.memory_budget_bytes, gpu.other_process_memory_bytes
    if vllm is None or budget is None or not others or gpu.unknown_process_memory_bytes:
        return False
    return vllm <= budget


def _free_memory_short(gpu: GpuDerived, settings: PolicySettings) -> str | None:
    """The reason line when `gpu`'s free memory is under min_gpu_free_ratio of its total, else None."""
    free = _free_ratio(gpu)
    if free is None or free >= settings.min_gpu_free_ratio:
        return None
    shown, limit = compare(100 * free, 100 * settings.min_gpu_free_ratio, digits=1)
    return f"GPU free memory {shown} % < {limit} % of total on GPU {gpu.gpu}"


def next_waiting_streaks(previous: Mapping[str, int], derived: Derived, settings: PolicySettings) -> dict[str, int]:
    """Consecutive polls on which each engine had waiting > waiting_ratio x running."""
    return {
        engine_key(e): previous.get(engine_key(e), 0) + 1 if _waiting_exceeds(e, settings) else 0
        for e in derived.engines
    }


def next_oom_streaks(previous: Mapping[int, int], derived: Derived, settings: PolicySettings) -> dict[int, int]:
    """Consecutive polls on which each GPU's forecast time to OOM was under oom_forecast_s."""
    return {
        g.gpu: previous.get(g.gpu, 0) + 1
        if g.time_to_oom_seconds is not None and g.time_to_oom_seconds < settings.oom_forecast_s
        else 0
        for g in derived.gpus
    }


def pause_findings(
    derived: Derived, settings: PolicySettings, waiting_streaks: Mapping[str, int], probe_line: str | None = None
) -> list[Finding]:
    """The pause conditions met now, most telling first. `probe_line`: the engine probe's pause line, while its
    completion has waited stall_pause_after_s for an answer or proved a wedge (see `probe`)."""
    found = _unhealthy(derived)
    for e in derived.engines:
        usage = e.kv_cache_usage_ratio
        if usage is not None and usage >= settings.pause_kv_usage_ratio:
            shown, limit = compare(usage, settings.pause_kv_usage_ratio)
            text = f"KV cache usage {shown} >= {limit} on {engine_label(e, derived)}"
            found.append(Finding(rule=PauseRule.KV_CACHE_USAGE, text=text))
    for e in derived.engines:
        ticks = waiting_streaks.get(engine_key(e), 0)
        if ticks >= settings.waiting_ticks and queued(e) is not None and e.requests_running is not None:
            text = (
                f"{_waiting_text(e)} > {settings.waiting_ratio:g} x running "
                f"{_count(e.requests_running)} for {plural(ticks, 'tick')} on {engine_label(e, derived)}"
            )
            found.append(Finding(rule=PauseRule.WAITING_QUEUE, text=text))
    for e in derived.engines:
        rate = e.preemptions_per_second
        if rate is not None and rate > settings.preemptions_per_s:
            shown, limit = compare(rate, settings.preemptions_per_s)
            text = f"preemptions {shown}/s > {limit}/s on {engine_label(e, derived)}"
            found.append(Finding(rule=PauseRule.PREEMPTIONS, text=text))
    for g in derived.gpus:
        short = _free_memory_short(g, settings)
        if short is not None and not _held_by_others(g):
            found.append(Finding(rule=PauseRule.GPU_FREE_MEMORY, text=short))
    for e in derived.engines:
        stalled = _stalled_for(e, derived, settings.stall_pause_after_s)
        if stalled is not None:
            found.append(Finding(rule=PauseRule.ENGINE_STALLED, text=stalled))
    if probe_line is not None:
        found.append(Finding(rule=PauseRule.ENGINE_STALLED, text=probe_line))
    found.extend(_allocator_retries(derived, settings))
    return found


def _allocator_retries(derived: Derived, settings: PolicySettings) -> list[Finding]:
    """GPUs whose PyTorch allocator (allocator probe) retried allocations, or failed one, over the short horizon:
    it flushed its cache to fit the next request's tensors. Fewer requests in flight need fewer activations."""
    if settings.pause_alloc_retries <= 0:
        return []
    found: list[Finding] = []
    for allocator in derived.allocators:
        retries, ooms = allocator.alloc_retries_recent or 0, allocator.ooms_recent or 0
        if retries < settings.pause_alloc_retries and not ooms:
            continue
        found.append(Finding(rule=PauseRule.ALLOCATOR_RETRIES, text=_retries_text(allocator, retries, ooms)))
    return found


def _retries_text(allocator: AllocatorDerived, retries: int, ooms: int) -> str:
    where = f"GPU {allocator.gpu}" + (f" rank {allocator.rank}" if allocator.rank != "none" else "")
    failed = f", {ooms} out of memory" if ooms else ""
    ratio = allocator.fragmentation_ratio
    split = f", {100 * ratio:.0f} % of its reserved memory in split free pieces" if ratio is not None else ""
    return f"PyTorch's allocator retried {plural(retries, 'allocation')}{failed} in the last polls on {where}{split}"


def _work(engine: EngineDerived) -> str:
    """What an engine had to do, for a stall's line: its running and waiting requests, or, when its gauges read
    idle, the requests in flight at vLLM's API server (/load) that made it a stall."""
    running, waiting = engine.requests_running or 0, engine.requests_waiting or 0
    if running and waiting:
        return f"{plural(running, 'request', spec='g')} running and {_count(waiting)} waiting"
    if running:
        return f"{plural(running, 'request', spec='g')} running"
    if waiting:
        return f"{plural(waiting, 'request', spec='g')} waiting and none running"
    return "requests in flight at vLLM's API server while its engine reads idle"


def _unhealthy(derived: Derived) -> list[Finding]:
    """Engines vLLM's fault tolerance reports unhealthy: vLLM already answers 503 for them, and the pod must leave
    the load balancer's rotation too (a router that does not read vllm:engine_healthy keeps sending traffic)."""
    found: list[Finding] = []
    for e in derived.engines:
        if e.engine_healthy is False:
            # How long is said by the pause that it holds ("since N s"; see `admission`), not here a second time.
            text = f"vLLM reports {engine_label(e, derived)} unhealthy (fault tolerance: vllm:engine_healthy 0)"
            found.append(Finding(rule=PauseRule.ENGINE_UNHEALTHY, text=text))
    return found


def _stalled_for(engine: EngineDerived, derived: Derived, limit_s: float) -> str | None:
    """The line for an engine with work (requests waiting or running) and no progress for at least `limit_s`;
    None otherwise. The stall is 0 without work (see sidecar.derive.progress)."""
    stalled = engine.engine_stalled_seconds
    if stalled is None or stalled <= 0 or stalled < limit_s:
        return None
    return (
        f"{engine_label(engine, derived)} made no progress for {stalled:.0f} s >= {limit_s:.0f} s with {_work(engine)}"
    )


def resume_blockers(derived: Derived, settings: PolicySettings, probe_line: str | None = None) -> list[Finding]:
    """What still keeps an automatic pause: KV usage above the resume threshold, or any other condition."""
    found: list[Finding] = []
    for e in derived.engines:
        usage = e.kv_cache_usage_ratio
        if usage is not None and usage > settings.resume_kv_usage_ratio:
            shown, limit = compare(usage, settings.resume_kv_usage_ratio)
            text = f"KV cache usage {shown} > {limit} resume threshold on {engine_label(e, derived)}"
            found.append(Finding(rule=PauseRule.KV_CACHE_USAGE, text=text))
    for e in derived.engines:
        if _waiting_exceeds(e, settings) and e.requests_running is not None:
            text = (
                f"{_waiting_text(e)} > {settings.waiting_ratio:g} x running "
                f"{_count(e.requests_running)} on {engine_label(e, derived)}"
            )
            found.append(Finding(rule=PauseRule.WAITING_QUEUE, text=text))
    # Preemptions, GPU memory and an unhealthy engine have no band of their own: clear means back on the right side.
    found.extend(f for f in pause_findings(derived, settings, {}, probe_line) if f.rule != PauseRule.KV_CACHE_USAGE)
    return found


def pressure_findings(
    derived: Derived, settings: PolicySettings, waiting_streaks: Mapping[str, int], oom_streaks: Mapping[int, int]
) -> list[Finding]:
    """Conditions partly met (see the module docstring); the caller knows admission is open."""
    found: list[Finding] = []
    for e in derived.engines:
        usage = e.kv_cache_usage_ratio
        if usage is not None and settings.resume_kv_usage_ratio < usage < settings.pause_kv_usage_ratio:
            shown, low = compare(usage, settings.resume_kv_usage_ratio)
            text = f"KV cache usage {shown} above {low} on {engine_label(e, derived)}"
            found.append(Finding(rule=None, text=text))
        ticks = waiting_streaks.get(engine_key(e), 0)
        if 0 < ticks < settings.waiting_ticks:
            what = "waiting" if e.requests_waiting_capacity is None else "waiting for capacity"
            text = (
                f"{what} > {settings.waiting_ratio:g} x running for {ticks} of {settings.waiting_ticks} ticks "
                f"on {engine_label(e, derived)}"
            )
            found.append(Finding(rule=None, text=text))
        stalled = e.engine_stalled_seconds
        under = min(settings.stall_pause_after_s, settings.hung_after_s)
        if stalled is not None and 0 < stalled < under:
            text = f"{engine_label(e, derived)} made no progress for {stalled:.0f} s with {_work(e)}"
            found.append(Finding(rule=None, text=text))
    for g in derived.gpus:
        short = _free_memory_short(g, settings)
        if short is not None and _held_by_others(g):
            held = gib(g.other_process_memory_bytes or 0)
            text = f"{short}, held by other processes ({held}) with vLLM inside its budget: not paused"
            found.append(Finding(rule=None, text=text))
        ticks = oom_streaks.get(g.gpu, 0)
        if 0 < ticks < settings.oom_forecast_ticks and g.time_to_oom_seconds is not None:
            text = (
                f"forecast time to OOM {g.time_to_oom_seconds:.0f} s < {settings.oom_forecast_s:.0f} s on GPU {g.gpu}"
            )
            found.append(Finding(rule=None, text=text))
    return found


def hung_cause(
    derived: Derived, settings: PolicySettings, *, wedge: str | None = None, stall_alone: bool = True
) -> RestartCause | None:
    """A hung engine, which vLLM's /health cannot show.

    With the engine probe (`wedge`: its line when a 1-token completion got no answer and nothing moved since),
    an engine without progress for hung_after_s, idle-looking or not. Where no probe can tell (`stall_alone`:
    probes off, or their answers say nothing), an engine with work and no progress for
    hung_without_probe_after_s. Otherwise a stall alone is not enough: the probe decides (see `probe`).
    """
    for e in derived.engines:
        quiet = e.seconds_since_progress
        if wedge is not None and quiet is not None and quiet >= settings.hung_after_s:
            text = f"{engine_label(e, derived)} made no progress for {quiet:.0f} s >= {settings.hung_after_s:.0f} s"
            return RestartCause(reason=RestartReason.ENGINE_HUNG, text=f"{text}, and {wedge} (hung)")
        stalled = _stalled_for(e, derived, settings.hung_without_probe_after_s) if stall_alone else None
        if stalled is not None:
            return RestartCause(reason=RestartReason.ENGINE_HUNG, text=stalled + " (hung)")
    return None


def oom_cause(derived: Derived, settings: PolicySettings, oom_streaks: Mapping[int, int]) -> RestartCause | None:
    """A GPU whose forecast time to OOM stayed under oom_forecast_s for oom_forecast_ticks polls."""
    for g in derived.gpus:
        ticks = oom_streaks.get(g.gpu, 0)
        if ticks >= settings.oom_forecast_ticks and g.time_to_oom_seconds is not None:
            text = (
                f"forecast time to OOM {g.time_to_oom_seconds:.0f} s < {settings.oom_forecast_s:.0f} s "
                f"for {plural(ticks, 'tick')} on GPU {g.gpu}"
            )
            return RestartCause(reason=RestartReason.OOM_FORECAST, text=text)
    return None
