"""Concurrency misjudgement: max_num_seqs admits more requests than the KV pool holds at real request sizes.

The scheduler then preempts (recomputes) requests whenever decoding needs a block, and queues the rest. The
pool's size is vLLM's own (`cache_config_info`), the request size the mean prompt + output of its token
histograms, max_num_seqs comes from the arguments it logged. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sidecar.doctor import formula
from sidecar.doctor.blowout import MIN_REQUESTS
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import tokens
from sidecar.doctor.logfacts import FULL_CACHE, LogFacts, SchedulerStats
from sidecar.doctor.remedies import sequences
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import available
from sidecar.model.text import plural

CONCURRENCY_RATIO = 1.5  # max_num_seqs at least this many times what the pool holds
STORM_PREEMPTIONS = 10  # from this many preemptions in a log on, fewer sequences is worth a first step unsized


def live_concurrency(evidence: Evidence, setup: Setup) -> Finding | None:
    reading = evidence.live.reading
    traffic = evidence.live.traffic
    pool = setup.kv_pool_tokens
    if reading is None or traffic is None or pool is None or pool.value <= 0 or traffic.requests < MIN_REQUESTS:
        return None
    mean = traffic.mean_tokens
    if mean is None or mean <= 0:
        return None
    preemptions = sum(engine.preemptions_total or 0.0 for engine in reading.engines)
    waiting = sum(engine.requests_waiting or 0.0 for engine in reading.engines)
    seqs = setup.max_num_seqs
    holds = pool.value / mean
    too_many = seqs is not None and seqs.value >= CONCURRENCY_RATIO * holds
    if preemptions <= 0 and not too_many:
        return None
    computed = formula.max_num_seqs(pool.value, mean, traffic.requests)
    if seqs is not None and computed.value >= seqs.value:
        return None  # max_num_seqs is not what overfills the pool
    lines = [
        f"KV pool {tokens(pool.value)} tokens per engine ({pool.source})",
        f"mean request {mean:,.1f} tokens: prompt {traffic.prompt.mean or 0:,.1f} + output "
        f"{traffic.generation.mean or 0:,.1f} ({traffic.requests:,} finished requests)",
        f"the pool holds {holds:,.1f} such requests at once",
    ]
    if seqs is not None:
        lines.append(
            f"max_num_seqs {seqs.value} ({seqs.source}) x {mean:,.1f} = {tokens(seqs.value * mean)} tokens, "
            f"{seqs.value * mean / pool.value:.1f}x the pool"
        )
    else:
        lines.append("max_num_seqs unknown (give --vllm-log with vLLM's start lines to see it)")
    if preemptions > 0:
        lines.append(
            f"vLLM preempted requests {plural(preemptions, 'time', spec=',.0f')} since it started "
            "(vllm:num_preemptions_total)"
        )
    if waiting > 0:
        lines.append(f"{plural(waiting, 'request', spec=',.0f')} waiting now (vllm:num_requests_waiting)")
    recommendations = [Recommendation(flag="--max-num-seqs", value=computed.value, why=computed.why)]
    if preemptions > 0 or waiting > 0:
        recommendations.extend(queued_reqs(int(computed.value), setup))
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=f"more requests are admitted than the KV pool holds at real sizes ({holds:,.1f})",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def log_concurrency(evidence: Evidence, setup: Setup) -> Finding | None:
    """vLLM's own preemption warnings (V0: `... is preempted by PreemptionMode.X ... total_num_cumulative_preemption
    =N`): more requests ran than the KV cache holds. The stats line with the highest KV usage says how many
    requests filled it, which sizes max_num_seqs: running / usage x 90 %."""
    log = evidence.log
    if log is None:
        return None
    if log.swap_exhausted:
        return _swap_exhausted(log, setup)
    if not log.preemptions:
        return _squeezed(log, setup) or _full_and_queued(log.busiest) or _one_request_fills_it(log.busiest)
    mode = log.preemption_mode or "an unknown"
    told_by = "its warning" if log.preemptions_noticed_by is None else f"{log.preemptions_noticed_by}'s notices"
    at_least = ""
    if log.preemption_warnings > 1:
        told_by = f"{log.preemption_warnings} warnings, which V0 prints at the 1st, 51st, 101st... preemption"
        at_least = "at least "
    lines = [
        f"vLLM preempted requests {at_least}{plural(log.preemptions, 'time', spec=',')} ({told_by}, {mode} mode): "
        "the KV cache ran out"
    ]
    recommendations: list[Recommendation] = []
    busiest = log.busiest
    if busiest is not None and busiest.kv_usage > 0 and busiest.running > 0:
        holds = busiest.running / busiest.kv_usage
        swapped = f", {busiest.swapped} swapped out" if busiest.swapped else ""
        lines.append(
            f"at the fullest stats line {busiest.running} running requests{swapped} and {busiest.waiting:,} waiting "
            f"filled {busiest.kv_usage:.1%} of the KV cache: it holds about {busiest.running} / {busiest.kv_usage:.3f} "
            f"= {holds:,.1f} requests of today's size"
        )
        recommendations.extend(_seqs_the_cache_holds(busiest, setup, instead="being preempted and recomputed"))
    elif log.preemptions >= STORM_PREEMPTIONS and (
        halved := sequences(
            setup,
            log,
            f"a first step: {log.preemptions:,} preemptions say fewer requests should run at once; the stats line "
            "that would size it is not in the log",
        )
    ):
        lines.append("no stats line (Running: ... GPU KV cache usage: ...) in the log: the step is not sized")
        recommendations.append(halved)
        recommendations.extend(queued_reqs(int(halved.value), setup))
    else:
        lines.append("no stats line (Running: ... GPU KV cache usage: ...) in the log: max_num_seqs cannot be sized")
    lines.append(MORE_KV_ROOM)
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=(
            f"vLLM preempted requests {at_least}{plural(log.preemptions, 'time', spec=',')}: more run at once than "
            "its KV cache holds"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


V0_SWAP_SPACE_GIB = 4  # V0's --swap-space default, per GPU


def _swap_exhausted(log: LogFacts, setup: Setup) -> Finding:
    """V0 preempts a running group by swapping its KV blocks to CPU memory; with the swap space full it aborts the
    engine. More groups ran than the KV cache holds, for longer than the swap space could absorb."""
    recommendations: list[Recommendation] = []
    halved = sequences(setup, log, "preemptions filled the swap space: fewer requests should run at once")
    if halved is not None:
        recommendations.append(halved)
    if available("--swap-space", setup.version, v0_log=True):
        now = log.args.swap_space if log.args is not None and log.args.swap_space else None
        base = now or V0_SWAP_SPACE_GIB
        said = f"today {now:g} GiB" if now else f"V0's default {V0_SWAP_SPACE_GIB} GiB, assumed"
        recommendations.append(
            Recommendation(
                flag="--swap-space",
                value=int(base * 2),
                why=f"or room for more swapped-out requests: {said} x 2, per GPU, from the host's memory",
            )
        )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.CRITICAL,
        summary="vLLM's engine aborted: preempted requests filled the CPU swap space",
        evidence=(
            "V0 aborted: 'Aborted due to the lack of CPU swap space': it preempts a running request by swapping "
            "its KV cache to CPU memory, and more were swapped out than the swap space holds",
            MORE_KV_ROOM,
        ),
        recommendations=tuple(recommendations),
        steps=()
        if recommendations
        else ("the log shows neither max_num_seqs nor the engine's version: halve whichever max_num_seqs you set",),
    )


SQUEEZED_SHARE = 0.8  # running at a full cache fell to this share of its most, or below: the cache squeezed them


def _squeezed(log: LogFacts, setup: Setup) -> Finding | None:
    """No preemption warning (V1 before 0.11.2 prints none), but the stats lines show its work: with the KV cache
    full and requests waiting, fewer and fewer run as the running ones grow, the rest pushed back to the queue
    (V1 preempts by recompute) or held in it. The fewest that ran at a full cache are how many of today's
    requests it holds at their longest: max_num_seqs at that, less the headroom, keeps those admitted in it."""
    least, most = log.full_least, log.full_most_running
    if least is None or most is None or least.running <= 0 or least.running > SQUEEZED_SHARE * most:
        return None
    holds = least.running / least.kv_usage
    lines = [
        f"with the KV cache full (stats lines at {FULL_CACHE:.0%} or more, and the line after each) the running "
        f"requests fell from {most} to "
        f"{least.running} while {least.waiting:,} waited: the running ones grew into the cache and the rest were "
        "pushed back or held in the queue (V1 preempts by recompute; this version's stats line does not count it)",
        f"at the fullest squeeze {least.running} running filled {least.kv_usage:.1%} of the KV cache: it holds about "
        f"{least.running} / {least.kv_usage:.3f} = {holds:,.1f} requests of today's size at their longest",
        MORE_KV_ROOM,
    ]
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=(
            f"vLLM's KV cache was full and squeezed the running requests from {most} to {least.running}: more were "
            "admitted than it holds at their length"
        ),
        evidence=tuple(lines),
        recommendations=tuple(_seqs_the_cache_holds(least, setup, instead="being admitted and pushed back")),
    )


def _seqs_the_cache_holds(stats: SchedulerStats, setup: Setup, *, instead: str) -> list[Recommendation]:
    """--max-num-seqs at the requests a stats line shows the KV cache holding (running / usage), less the
    headroom; `instead` says what the requests over it go through today."""
    holds = stats.running / stats.kv_usage
    value = max(1, math.floor(holds * formula.KV_HEADROOM_RATIO))
    return fewer_seqs(
        value,
        setup,
        unknown="now not in the log",
        why=lambda now: (
            f"{holds:,.1f} requests fit x {formula.KV_HEADROOM_RATIO:g} headroom = "
            f"{holds * formula.KV_HEADROOM_RATIO:,.2f}, rounded down -> {value} ({now}): the rest wait in the "
            f"queue instead of {instead}"
        ),
    )


FULL_KV_USAGE = 0.99  # a stats line at this KV usage, with more waiting than running: requests queue for KV space


def _full_and_queued(busiest: SchedulerStats | None) -> Finding | None:
    """No preemption yet, but a stats line with the KV cache full and more requests waiting than running: the
    cache, not the scheduler's limits, decides how many run, and the queue waits on it (clients time out). How
    many more it should hold depends on the card and the requests, which the log does not say: no number."""
    if busiest is None or busiest.kv_usage < FULL_KV_USAGE or busiest.waiting <= busiest.running:
        return None
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.WARNING,
        summary=(
            f"vLLM's KV cache was full with {busiest.waiting:,} requests waiting behind {busiest.running} running: "
            "more requests arrive at once than it holds"
        ),
        evidence=(
            f"at the fullest stats line {busiest.running} running and {busiest.waiting:,} waiting requests, KV cache "
            f"usage {busiest.kv_usage:.1%}: the running ones fill it, so the rest wait for its space",
        ),
        steps=(
            "fewer requests at once from the clients (or a router that holds them), shorter max_tokens; "
            + MORE_KV_ROOM,
        ),
    )


ONE_REQUEST_FILLS = 0.9  # one running request at this KV usage or more: the cache holds about one of its size


def _one_request_fills_it(busiest: SchedulerStats | None) -> Finding | None:
    """A stats line with one request running and the KV cache (nearly) full: the cache holds about one request
    of that length, so a longer one, or parallel samples of it, outgrow it. How much more room it needs depends on
    the requests, which the log does not size: no number."""
    if busiest is None or busiest.running != 1 or busiest.kv_usage < ONE_REQUEST_FILLS:
        return None
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.WARNING,
        summary=f"one request filled {busiest.kv_usage:.1%} of vLLM's KV cache: it holds about one request that long",
        evidence=(
            f"at the fullest stats line 1 running request (and {busiest.waiting:,} waiting) filled "
            f"{busiest.kv_usage:.1%} of the KV cache: a longer request, or more samples of it (n, beam search), "
            "does not fit: vLLM preempts it, and V0 may abort it",
        ),
        steps=(
            "a KV cache that holds several such requests: " + KV_ROOM_WAYS,
            "or shorter requests: a lower --max-model-len (the log does not say the cache's size in tokens: "
            "'# GPU blocks: N' x the block size, or 'GPU KV cache size: N tokens', does), a smaller max_tokens, "
            "fewer parallel samples",
        ),
    )


KV_ROOM_WAYS = (
    "--kv-cache-dtype fp8 (twice the tokens), a higher gpu_memory_utilization where the card has it free, or more GPUs"
)
MORE_KV_ROOM = "or give the KV cache more room: " + KV_ROOM_WAYS


def fewer_seqs(value: int, setup: Setup, *, unknown: str, why: Callable[[str], str]) -> list[Recommendation]:
    """--max-num-seqs `value` (and the queue cap that goes with it) when it is below what vLLM runs with now or
    that is not known; `why(now)` gives the arithmetic, `now` saying the current value and where it came from."""
    seqs = setup.max_num_seqs
    if seqs is not None and value >= seqs.value:
        return []
    now = f"now {seqs.value} ({seqs.source})" if seqs is not None else unknown
    return [Recommendation(flag="--max-num-seqs", value=value, why=why(now)), *queued_reqs(value, setup)]


def queued_reqs(seqs: int, setup: Setup) -> list[Recommendation]:
    """vLLM's load shedding: --max-num-queued-reqs caps running + waiting (SchedulerConfig, 0.29+), so one batch
    running and one waiting is twice max_num_seqs."""
    if not available("--max-num-queued-reqs", setup.version):
        return []
    value = 2 * seqs
    return [
        Recommendation(
            flag="--max-num-queued-reqs",
            value=value,
            why=(
                f"vLLM counts running + waiting requests against it: {seqs} running + one more batch ({seqs}) "
                f"waiting = {value}; beyond that it answers HTTP 503 so load balancers retry elsewhere instead of "
                "queueing behind preemptions"
            ),
        )
    ]
