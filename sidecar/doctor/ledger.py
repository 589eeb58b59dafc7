"""The memory ledger of the GPU an error hit: every amount the log states, each with the line it came from. Pure.

vLLM's budget is `gpu_memory_utilization x total`; the weights, the profile run's activation peak, non-torch
memory (CUDA context, NCCL) and the KV cache must fit in it, and anything else on the card must fit beside it.
The doctor's readings of a crash (`log_memory`) follow from this ledger, not from the error's wording: which
amounts overflow says what to change, and in which direction. An amount the log does not state is None; one
taken from vLLM's defaults or estimated from the model's name says so (`assumed`), and a decision that needs
a direction from an assumed amount is not taken (the reading says what to look for instead).

Amounts are per GPU: vLLM's workers print their own (`Model loading took` per rank), the OOM names its GPU,
and an estimate from the model's name is divided by the tensor and pipeline parallel sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.doctor.blowout import DEFAULT_BLOCK_SIZE
from sidecar.doctor.formula import GIB, RESERVE_RATIO, gib
from sidecar.doctor.logfacts import CudaOom, LogFacts
from sidecar.doctor.model_size import estimate, fp8_capable, weight_bits
from sidecar.doctor.setup import DEFAULT_UTILIZATION, Setup
from sidecar.model.gpu import ProcessOwner

_PROFILE = "vLLM's memory-profiling line"
FITS_SHARE = 0.75  # weights at most this share of what the card can give vLLM: they fit, with room for KV
DOES_NOT_FIT_SHARE = 0.90  # weights above this share leave too little for activations and any KV cache
GPU_MAX_UTILIZATION = 0.95  # vLLM on a card of its own keeps some room for the CUDA context and graphs
# An XLA device (a TPU under tpu-inference) has no CUDA context and no graph pool outside the budget: its own
# runs go to 0.98, so weights up to 97 % of a device still leave a budget above them some room.
XLA_MAX_UTILIZATION = 0.98
XLA_DOES_NOT_FIT_SHARE = 0.97
MIN_OTHER_BYTES = GIB  # less held by other processes is CUDA contexts and noise
# No GPU or TPU chip holds more (AMD's MI355X and NVIDIA's B300 carry 288 GB): weights per device beyond this do
# not fit whatever card the log leaves unnamed.
LARGEST_DEVICE_BYTES = 288 * GIB


class Accelerator(StrEnum):
    GPU = "gpu"  # CUDA, ROCm, XPU, NPU: a context and a graph pool beside the budget, and more cards to split over
    XLA = "xla"  # a TPU under tpu-inference (its own lines say so)
    METAL = "metal"  # Apple Silicon under vllm-metal: one device, its memory shared with macOS


@dataclass(frozen=True, slots=True, kw_only=True)
class Amount:
    value_bytes: float
    source: str
    assumed: bool = False

    def line(self, what: str) -> str:
        said = f"{what} {gib(self.value_bytes)} ({self.source})"
        return said + (", assumed" if self.assumed and "assumed" not in self.source else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryLedger:
    rank: int | None
    total: Amount | None
    utilization: float
    utilization_source: str
    utilization_assumed: bool
    weights: Amount | None  # per GPU; the low end when estimated
    weights_high_bytes: float | None  # per GPU, the high end of an estimate (the measured value otherwise)
    activation: Amount | None
    non_torch: Amount | None
    graphs: Amount | None
    kv: Amount | None  # the KV cache's memory; negative when the budget is short before any
    kv_tokens: int | None
    kv_tokens_source: str | None
    others: Amount | None  # what other processes hold on the card
    vllm_held: Amount | None  # at the error: vLLM's process, non-torch memory included
    stranded: Amount | None  # reserved by PyTorch but unallocated
    gpu_name: str | None = None  # NVML's name of the card, or the one the log prints
    weights_bits: int | None = None  # 4, 8 or 16 when the model's name, quantization or dtype says so
    accelerator: Accelerator = Accelerator.GPU
    host_memory: bool = False  # the CPU backend: the "card" is the host's memory, which has no such bound

    @property
    def xla(self) -> bool:
        return self.accelerator is Accelerator.XLA

    @property
    def more_devices(self) -> bool:
        """Whether the weights can be split over more devices (not on one Mac)."""
        return self.accelerator is not Accelerator.METAL

    @property
    def max_utilization(self) -> float:
        """The highest budget worth recommending on this kind of device."""
        return XLA_MAX_UTILIZATION if self.xla else GPU_MAX_UTILIZATION

    @property
    def does_not_fit_share(self) -> float:
        """Weights above this share of what the card gives vLLM leave too little for anything else."""
        return XLA_DOES_NOT_FIT_SHARE if self.xla else DOES_NOT_FIT_SHARE

    @property
    def fp8_capable(self) -> bool:
        return fp8_capable(self.gpu_name)

    @property
    def budget_bytes(self) -> float | None:
        return self.utilization * self.total.value_bytes if self.total is not None else None

    @property
    def others_bytes(self) -> float:
        return self.others.value_bytes if self.others is not None else 0.0

    @property
    def usable_bytes(self) -> float | None:
        """What the card can give vLLM: its total less what other processes hold."""
        return self.total.value_bytes - self.others_bytes if self.total is not None else None

    @property
    def ceiling(self) -> float | None:
        """The largest gpu_memory_utilization that fits beside the other processes, leaving the reserve free."""
        if self.total is None or self.total.value_bytes <= 0:
            return None
        reserve = 1 - XLA_MAX_UTILIZATION if self.xla else RESERVE_RATIO
        return (self.total.value_bytes - self.others_bytes) / self.total.value_bytes - reserve

    def weights_fit(self) -> bool | None:
        """True: the weights fit what the card can give, with room; False: they leave too little for anything
        else; None: the ledger cannot say (weights or the card unknown, or in between)."""
        usable = self.usable_bytes
        if usable is None and self.beyond_any_device:
            return False
        if self.weights is None or usable is None or usable <= 0:
            return None
        if self.weights.value_bytes > self.does_not_fit_share * usable:
            return False
        high = self.weights_high_bytes if self.weights_high_bytes is not None else self.weights.value_bytes
        if high <= FITS_SHARE * usable:
            return True
        return None

    @property
    def beyond_any_device(self) -> bool:
        """Measured weights per device that no GPU or TPU chip holds (a Mac's and a CPU's memory have no bound)."""
        weights = self.weights
        if weights is None or weights.assumed or self.host_memory or not self.more_devices:
            return False
        return weights.value_bytes > LARGEST_DEVICE_BYTES

    @property
    def budget_held_bytes(self) -> float | None:
        """What vLLM's budget held by its memory-profiling line: weights, non-torch memory, the activation peak and
        the KV cache are its parts (vLLM gives the KV cache the budget less the other three), so their sum is the
        budget in bytes even where the log states neither the card nor the utilisation."""
        parts = (self.weights, self.non_torch, self.activation, self.kv)
        if any(part is None or part.assumed for part in parts):
            return None
        held = sum(part.value_bytes for part in parts if part is not None)
        return held if held > 0 else None

    @property
    def unit(self) -> str:
        """What one of the accelerators is called in evidence: a TPU or a Mac's GPU is not what users call a GPU."""
        return "GPU" if self.accelerator is Accelerator.GPU else "device"

    def lines(self) -> list[str]:
        """The ledger as evidence, one line per amount the log states or that is assumed."""
        lines: list[str] = []
        where = f" (rank {self.rank})" if self.rank is not None else ""
        unit = self.unit
        if self.total is not None:
            lines.append(self.total.line(f"the {unit}{where}:"))
            assumed = ", assumed" if self.utilization_assumed else ""
            lines.append(
                f"vLLM's budget: gpu_memory_utilization {self.utilization:g} ({self.utilization_source}{assumed}) "
                f"x {gib(self.total.value_bytes)} = {gib(self.utilization * self.total.value_bytes)}"
            )
        for amount, what in (
            (self.others, "other processes hold"),
            (self.weights, f"weights per {unit}:"),
            (self.activation, "the profile run's activation peak"),
            (self.non_torch, "non-torch memory"),
            (self.graphs, "CUDA graphs"),
            (self.kv, "KV cache"),
            (self.vllm_held, "at the error vLLM's process held"),
            (self.stranded, "reserved by PyTorch but unallocated"),
        ):
            if amount is not None:
                lines.append(amount.line(what))
        if self.kv_tokens is not None:
            lines.append(f"KV cache holds {self.kv_tokens:,} tokens ({self.kv_tokens_source})")
        return lines


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
