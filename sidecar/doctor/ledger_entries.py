"""How the ledger's entries are read (`build_ledger`): each amount from the line that states it, else NVML's or
vLLM's metrics (`setup`), else an estimate from the model's name that says it was assumed. Pure.
"""

from __future__ import annotations

from sidecar.doctor.blowout import DEFAULT_BLOCK_SIZE
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import MIN_OTHER_BYTES, Accelerator, Amount, MemoryLedger
from sidecar.doctor.logfacts import CudaOom, LogFacts
from sidecar.doctor.model_size import estimate, weight_bits
from sidecar.doctor.setup import DEFAULT_UTILIZATION, Setup
from sidecar.model.gpu import ProcessOwner

_PROFILE = "vLLM's memory-profiling line"


def build_ledger(log: LogFacts, setup: Setup) -> MemoryLedger:
    oom = log.oom
    utilization = setup.gpu_memory_utilization
    value, source, assumed = (
        (utilization.value, utilization.source, False)
        if utilization is not None
        else (DEFAULT_UTILIZATION, f"vLLM's default {DEFAULT_UTILIZATION:g}: not in the log", True)
    )
    weights, weights_high = _weights(log, setup)
    others = _others(log, oom) or _live_others(setup)
    kv_tokens, kv_tokens_source = _kv_tokens(log, setup)
    return MemoryLedger(
        rank=oom.rank if oom is not None else None,
        total=_total(log, setup),
        utilization=value,
        utilization_source=source,
        utilization_assumed=assumed,
        weights=weights,
        weights_high_bytes=weights_high,
        activation=_gib(log.profile.activation_gib if log.profile else None, _profile_source(log)),
        non_torch=_gib(log.profile.non_torch_gib if log.profile else None, _profile_source(log)),
        graphs=_gib(
            (log.profile.cudagraph_gib if log.profile else None) or log.graph_capture_gib, "vLLM's graph-capture line"
        ),
        kv=_kv(log),
        kv_tokens=kv_tokens,
        kv_tokens_source=kv_tokens_source,
        others=others,
        vllm_held=_bytes(oom.process_bytes if oom else None, "the OOM message"),
        stranded=_bytes(oom.reserved_unallocated_bytes if oom else None, "the OOM message"),
        gpu_name=(setup.card.name if setup.card is not None else None) or log.gpu_name,
        weights_bits=weight_bits(
            log.model,
            dtype=(log.args.dtype if log.args is not None else None) or log.dtype,
            quantization=setup.quantization,
        ),
        accelerator=_accelerator(log),
        host_memory=log.device == "cpu",
    )


def _profile_source(log: LogFacts) -> str:
    return log.profile.source if log.profile is not None else _PROFILE


def _accelerator(log: LogFacts) -> Accelerator:
    if log.tpu_devices is not None or log.xla_refusal:
        return Accelerator.XLA
    return Accelerator.METAL if log.metal_refusal else Accelerator.GPU


def _gib(value: float | None, source: str) -> Amount | None:
    return None if value is None else Amount(value_bytes=value * GIB, source=source)


def _bytes(value: float | None, source: str) -> Amount | None:
    return None if value is None else Amount(value_bytes=value, source=source)


def _total(log: LogFacts, setup: Setup) -> Amount | None:
    if log.oom is not None and log.oom.total_bytes:
        return Amount(value_bytes=log.oom.total_bytes, source="the OOM message")
    refusal = log.refusal
    if refusal is not None and refusal.total_gib:
        return Amount(value_bytes=refusal.total_gib * GIB, source="vLLM's refusal to start")
    if log.profile is not None and log.profile.total_gib:
        return Amount(value_bytes=log.profile.total_gib * GIB, source=log.profile.source)
    if setup.card is not None and setup.card.memory_total_bytes > 0:
        return Amount(value_bytes=setup.card.memory_total_bytes, source="NVML")
    return None


def _weights(log: LogFacts, setup: Setup) -> tuple[Amount | None, float | None]:
    if log.weights_gib is not None:
        measured = log.weights_gib * GIB
        plugin = log.profile is not None and log.profile.source != _PROFILE and log.profile.weights_gib is not None
        source = log.profile.source if plugin and log.profile is not None else "the model-loading line"
        return Amount(value_bytes=measured, source=source), measured
    if log.model is None:
        return None, None
    args = log.args
    found = estimate(
        log.model,
        dtype=(args.dtype if args is not None else None) or log.dtype,
        quantization=setup.quantization,
    )
    if found is None:
        return None, None
    gpus = max(1, setup.tensor_parallel_size) * max(1, log.pipeline_parallel_size or 1)
    if args is not None and args.pipeline_parallel_size:
        gpus = max(1, setup.tensor_parallel_size) * args.pipeline_parallel_size
    split = f" / {gpus} GPUs" if gpus > 1 else ""
    return (
        Amount(value_bytes=found.low_bytes / gpus, source=found.why + split, assumed=True),
        found.high_bytes / gpus,
    )


def _kv(log: LogFacts) -> Amount | None:
    if log.available_kv_gib is not None:
        uneven = log.available_kv_max_gib is not None and log.available_kv_max_gib != log.available_kv_gib
        return _gib(log.available_kv_gib, "vLLM's available KV cache memory" + (", its least rank's" if uneven else ""))
    if log.profile is not None and log.profile.kv_gib is not None:
        return _gib(log.profile.kv_gib, log.profile.source)
    if log.refusal is not None and log.refusal.available_gib is not None:
        return _gib(log.refusal.available_gib, "vLLM's refusal to start")
    return None


def _kv_tokens(log: LogFacts, setup: Setup) -> tuple[int | None, str | None]:
    if log.kv_cache_tokens is not None:
        return log.kv_cache_tokens, "the KV cache size vLLM logged"
    if log.num_gpu_blocks is not None:
        block = setup.block_size.value if setup.block_size is not None else None
        if block is not None:
            return log.num_gpu_blocks * block, f"{log.num_gpu_blocks:,} blocks x {block} tokens"
        return (
            log.num_gpu_blocks * DEFAULT_BLOCK_SIZE,
            f"{log.num_gpu_blocks:,} blocks x {DEFAULT_BLOCK_SIZE} tokens, vLLM's default block size, assumed",
        )
    return None, None


def _outside(oom: CudaOom) -> float | None:
    """What the card holds besides this process and what is free: other processes' memory, whether PyTorch lists
    them or not (older releases list none). Needs this process's own total, which PyTorch states."""
    held = _this_process(oom)
    if oom.total_bytes is None or oom.free_bytes is None or held is None:
        return None
    return max(0.0, oom.total_bytes - oom.free_bytes - held)


def _this_process(oom: CudaOom) -> float | None:
    """What this process held: its total as PyTorch states it, but never less than what PyTorch itself reserved
    (a worker process's OOM can say "this process has 0 bytes memory in use" beside 20 GiB allocated)."""
    if oom.process_bytes is None:
        return None
    reserved = (oom.allocated_bytes or 0) + (oom.reserved_unallocated_bytes or 0)
    return max(oom.process_bytes, reserved)


def _live_others(setup: Setup) -> Amount | None:
    """Other tenants NVML sees on the card now (the doctor run beside a vLLM that failed to start)."""
    card = setup.card
    if card is None:
        return None
    held = sum(p.used_memory_bytes or 0 for p in card.processes if p.owner is ProcessOwner.OTHER)
    return Amount(value_bytes=held, source="NVML: processes that are not vLLM's") if held >= MIN_OTHER_BYTES else None


def _others(log: LogFacts, oom: CudaOom | None) -> Amount | None:
    if oom is not None:
        held = sum(size for _, size in oom.other_processes)
        outside = _outside(oom)
        if outside is not None and outside > held + MIN_OTHER_BYTES:
            return Amount(
                value_bytes=outside,
                source=(
                    f"{gib(oom.total_bytes or 0)} total - {gib(oom.free_bytes or 0)} free - "
                    f"{gib(_this_process(oom) or 0)} this process held, in the OOM message: the rest is other "
                    "processes'" + (f" ({gib(held)} of it listed)" if held else "")
                ),
            )
        if held >= MIN_OTHER_BYTES:
            listed = ", ".join(f"pid {pid} {gib(size)}" for pid, size in oom.other_processes)
            return Amount(value_bytes=held, source=f"the OOM message lists {listed}")
    refusal = log.refusal
    free = refusal.free_gib if refusal is not None else None
    total = refusal.total_gib if refusal is not None else None
    if (free is None or total is None) and log.profile is not None:
        free, total = log.profile.free_gib, log.profile.total_gib
    if free is not None and total is not None and (total - free) * GIB >= MIN_OTHER_BYTES:
        return Amount(
            value_bytes=(total - free) * GIB,
            source=f"{total:.2f} GiB total - {free:.2f} GiB free when vLLM started (its own CUDA context included)",
        )
    return None
