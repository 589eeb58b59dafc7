"""Configuration overshoot: vLLM's budget (gpu_memory_utilization x total) is more than the card can give it.

Either another process holds part of the card, or vLLM's own process is beyond its budget (activations the
profile run never saw), or the budget leaves less than the 5 % reserve. Read live from the GPUs and from a log's
start refusal or CUDA OOM. Also here: the
allocator-fragmentation rule (`allocator_fragmentation`), reusable with any source of the allocator's numbers.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor import formula
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.setup import Setup
from sidecar.model.gpu import GpuDevice, ProcessOwner
from sidecar.model.status import GpuStatus

MIN_OVER_BUDGET_BYTES = GIB  # below max(1 GiB, 2 % of the card), beyond-budget memory is CUDA context and noise
MIN_OVER_BUDGET_RATIO = 0.02
MIN_TREND_R2 = 0.5  # the daemon's own default before it forecasts an OOM
URGENT_OOM_S = 3600.0
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLook:
    """One GPU as the overshoot rule sees it."""

    device: GpuDevice
    others_bytes: int
    vllm_bytes: int  # vLLM's processes, or everything not known to be another process
    budget_bytes: int | None
    trend: GpuStatus | None

    @property
    def over_budget_bytes(self) -> int:
        if self.budget_bytes is None:
            return 0
        over = self.vllm_bytes - self.budget_bytes
        tolerance = max(MIN_OVER_BUDGET_BYTES, MIN_OVER_BUDGET_RATIO * self.device.memory_total_bytes)
        return over if over > tolerance else 0

    @property
    def low_free(self) -> bool:
        return self.device.memory_free_bytes < formula.RESERVE_RATIO * self.device.memory_total_bytes

    @property
    def growing(self) -> bool:
        trend = self.trend
        return (
            trend is not None
            and (trend["memory_growth_bytes_per_second"] or 0.0) > 0
            and (trend["memory_growth_fit_r2"] or 0.0) >= MIN_TREND_R2
        )

    @property
    def tenant(self) -> bool:
        if self.others_bytes <= 0:
            return False
        if self.budget_bytes is None:
            return self.low_free
        total = self.device.memory_total_bytes
        return self.budget_bytes + self.others_bytes > total * (1 - formula.RESERVE_RATIO)


def live_overshoot(evidence: Evidence, setup: Setup) -> Finding | None:
    reading = evidence.gpu.reading
    if reading is None or not reading.devices:
        return None
    trends = {trend["gpu"]: trend for trend in evidence.history.gpus} if evidence.history is not None else {}
    utilization = setup.gpu_memory_utilization
    looks = [
        _look(device, utilization.value if utilization else None, trends.get(device.index))
        for device in reading.devices
        if device.memory_total_bytes > 0
    ]
    # Memory beyond the budget that keeps growing is the memory_leak finding's (see `leak`), not a budget too high.
    affected = [
        look for look in looks if look.tenant or ((look.over_budget_bytes or look.low_free) and not look.growing)
    ]
    if not affected:
        return None
    evidence_lines: list[str] = []
    for look in affected:
        evidence_lines.extend(_describe(look, setup))
    if evidence.history is not None and evidence.history.restarts:
        restarts = ", ".join(f"{reason}: {count}" for reason, count in evidence.history.restarts)
        evidence_lines.append(f"the sidecar restarted vLLM ({restarts}) according to {evidence.history.source}")
    recommendations = _recommendations(affected, setup)
    urgent = any(look.low_free for look in affected) or any(
        look.trend is not None and look.growing and (look.trend["time_to_oom_seconds"] or URGENT_OOM_S) < URGENT_OOM_S
        for look in affected
    )
    causes = []
    if any(look.tenant for look in affected):
        causes.append("another process shares the GPU")
    if any(look.over_budget_bytes and not look.growing for look in affected):
        causes.append("vLLM's own memory is beyond its budget")
    if not causes:
        causes.append("the budget leaves less than the 5 % reserve free")
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL if urgent else Severity.WARNING,
        summary=f"gpu_memory_utilization is too high for what the card can give vLLM: {'; '.join(causes)}",
        evidence=tuple(evidence_lines),
        recommendations=tuple(recommendations),
    )


def _look(device: GpuDevice, utilization: float | None, trend: GpuStatus | None) -> GpuLook:
    others = sum(p.used_memory_bytes or 0 for p in device.processes if p.owner is ProcessOwner.OTHER)
    return GpuLook(
        device=device,
        others_bytes=others,
        vllm_bytes=device.memory_used_bytes - others,
        budget_bytes=int(utilization * device.memory_total_bytes) if utilization is not None else None,
        trend=trend,
    )


def _describe(look: GpuLook, setup: Setup) -> list[str]:
    device = look.device
    total = device.memory_total_bytes
    free_share = device.memory_free_bytes / total
    lines = [
        f"GPU {device.index} ({device.name or 'unnamed'}): {gib(total)} total, {gib(device.memory_used_bytes)} used, "
        f"{gib(device.memory_free_bytes)} free ({free_share:.1%}"
        + (f" < the {formula.RESERVE_RATIO:.0%} reserve)" if look.low_free else ")")
    ]
    utilization = setup.gpu_memory_utilization
    if look.budget_bytes is not None and utilization is not None:
        lines.append(
            f"vLLM's budget: gpu_memory_utilization {utilization.value:g} ({utilization.source}) x {gib(total)} "
            f"= {gib(look.budget_bytes)}"
        )
        held = look.vllm_bytes - look.budget_bytes
        relation = f"{gib(held)} beyond its budget" if held > 0 else f"{gib(-held)} under its budget"
        lines.append(f"vLLM's processes hold {gib(look.vllm_bytes)}: {relation}")
    else:
        lines.append("vLLM's gpu_memory_utilization is unknown (no cache_config_info, no log): budget not checked")
    hidden = sum(p.used_memory_bytes or 0 for p in device.processes if p.owner is ProcessOwner.UNKNOWN)
    if hidden:
        lines.append(
            f"{gib(hidden)} is held by processes whose name is not visible here (another PID namespace): counted as "
            "vLLM's; run the doctor where it sees them, or give --vllm-process-pattern"
        )
    lines.extend(
        f"another process on GPU {device.index}: pid {p.pid} {p.name or '(name not visible)'!r} holds "
        f"{gib(p.used_memory_bytes or 0)}"
        for p in device.processes
        if p.owner is ProcessOwner.OTHER
    )
    if look.growing and look.trend is not None:
        trend = look.trend
        growth = (trend["memory_growth_bytes_per_second"] or 0.0) / 2**20
        when = (
            f"; the daemon forecasts an OOM in {trend['time_to_oom_seconds']:,.0f} s"
            if trend["time_to_oom_seconds"] is not None
            else ""
        )
        lines.append(
            f"GPU {device.index} memory grows {growth:,.1f} MiB/s (R² {trend['memory_growth_fit_r2']:.2f}){when}"
        )
    return lines


def _recommendations(affected: list[GpuLook], setup: Setup) -> list[Recommendation]:
    recommendations: list[Recommendation] = []
    utilization = setup.gpu_memory_utilization
    if utilization is not None:
        candidates = [
            formula.utilization(look.device.memory_total_bytes, look.others_bytes, look.over_budget_bytes)
            for look in affected
        ]
        lowest = min(candidates, key=lambda computed: computed.value)
        if lowest.value < utilization.value:
            recommendations.append(
                Recommendation(
                    flag="--gpu-memory-utilization", value=lowest.value, why=f"{lowest.why} (now {utilization.value:g})"
                )
            )
    if any(look.over_budget_bytes and not look.growing for look in affected):
        recommendations.append(
            Recommendation(
                flag=ALLOC_CONF,
                value=EXPANDABLE,
                why=(
                    "vLLM's memory grows beyond the budget it profiled: expandable segments let PyTorch's caching "
                    "allocator grow and reuse segments instead of stranding reserved-but-unallocated memory "
                    "(set it in vLLM's environment unless it is already)"
                ),
            )
        )
        recommendations.extend(batched_tokens_cut(setup, affected[0].device))
    return recommendations


def batched_tokens_cut(setup: Setup, card: GpuDevice | None) -> list[Recommendation]:
    """Cut --max-num-batched-tokens to vLLM's default for the card when it is set above it."""
    current = setup.max_num_batched_tokens
    if current is None or card is None:
        return []
    default = formula.card_batched_tokens(card.memory_total_bytes, card.name)
    if current.value <= default.value:
        return []
    return [
        Recommendation(
            flag="--max-num-batched-tokens",
            value=default.value,
            why=f"activation memory grows with the tokens of one step: {current.value} ({current.source}) -> "
            f"{default.why}",
        )
    ]


# Allocator fragmentation. `allocator_fragmentation` takes the allocator's numbers, not a log: today the doctor
# feeds it PyTorch's CUDA OOM message ("X is reserved by PyTorch but unallocated"); the allocator probe's readings
# (reserved minus allocated, or inactive split bytes) can be fed to it the same way. It is fragmentation, and not
# simply too little memory, when the memory PyTorch reserved but could not use is large (at least 256 MiB) and,
# added to what the card still had free, would have held the allocation that failed: the bytes were there, split
# into segments too small for the request. Expandable segments let the allocator grow a segment in place.
MIN_STRANDED_BYTES = 256 * 2**20  # below this the stranded memory is the allocator's normal slack


def allocator_fragmentation(
    *,
    reserved_unallocated_bytes: int,
    failed_allocation_bytes: int,
    total_bytes: int | None,
    free_bytes: int = 0,
    where: str = "the CUDA out-of-memory error",
) -> Finding | None:
    """A finding when the stranded memory would have held the failed allocation; None otherwise.

    `failed_allocation_bytes` is what could not be allocated (0 when nothing failed: then only the size of the
    stranded memory against the card counts, at least 5 % of `total_bytes`).
    """
    stranded = reserved_unallocated_bytes
    if stranded < MIN_STRANDED_BYTES:
        return None
    shortfall = max(0, failed_allocation_bytes - free_bytes)
    if failed_allocation_bytes > 0:
        if stranded < shortfall:
            return None  # even every stranded byte would not have held it: the card is simply too full
    elif total_bytes is None or stranded < 0.05 * total_bytes:
        return None
    lines = [
        f"{where}: {gib(stranded)} reserved by PyTorch but unallocated"
        + (f" of a {gib(total_bytes)} card" if total_bytes else ""),
    ]
    if failed_allocation_bytes > 0:
        lines.append(
            f"the failed allocation of {gib(failed_allocation_bytes)} lacked {gib(shortfall)} beyond the "
            f"{gib(free_bytes)} free; the stranded {gib(stranded)} is {stranded / max(shortfall, 1):,.1f}x that "
            "shortfall: the memory was there, split into pieces too small for the request"
        )
    why = (
        f"{gib(stranded)} stranded >= {gib(shortfall)} missing: expandable segments let PyTorch's caching "
        "allocator grow a segment in place instead of leaving reserved pieces unusable (set it in vLLM's "
        "environment; PyTorch's own message suggests it)"
    )
    return Finding(
        cause=Cause.ALLOCATOR_FRAGMENTATION,
        severity=Severity.CRITICAL if failed_allocation_bytes > 0 else Severity.WARNING,
        summary=f"PyTorch's allocator held {gib(stranded)} it could not use: its free memory is split too finely",
        evidence=tuple(lines),
        recommendations=(Recommendation(flag=ALLOC_CONF, value=EXPANDABLE, why=why),),
    )
