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

from sidecar.doctor.formula import GIB, RESERVE_RATIO, gib
from sidecar.doctor.model_size import fp8_capable

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
