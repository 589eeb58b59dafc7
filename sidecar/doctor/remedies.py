"""The flag changes a memory reading can recommend, each sized from the ledger with its arithmetic. Pure.

Each function returns the recommendation or nothing when the ledger cannot size it; none decides whether it
applies (that is `log_memory`'s reading of the ledger). Directions: a smaller model per GPU for weights that do
not fit; a budget within what the card has free for another tenant; a lower budget for a transient after the
KV cache; a larger budget, fewer sequences or fewer batched tokens when the weights fit but leave no KV cache.
"""

from __future__ import annotations

import math

from sidecar.doctor import formula
from sidecar.doctor.finding import Recommendation
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import Amount, MemoryLedger
from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.overshoot import ALLOC_CONF, EXPANDABLE
from sidecar.doctor.setup import DEFAULT_UTILIZATION, V0_MAX_NUM_SEQS, Setup

MAX_TENSOR_PARALLEL = 64  # past a node's 8 GPUs, tensor and pipeline parallel across nodes
TARGET_WEIGHT_SHARE = 0.75  # weights may take at most this much of what each GPU gives vLLM after a remedy
MIN_BATCHED_TOKENS = 256
MIN_USEFUL_UTILIZATION = 0.1  # below this share of the card, a lower budget is no way out: free the GPU
MIN_LEFTOVER_UTILIZATION = 0.01  # ... unless the model is small: the least budget vLLM is given then
LEFTOVER_MARGIN_RATIO = 0.01  # below the free memory at start, for vLLM's CUDA context and rounding
MIN_LEFTOVER_BYTES = 2 * GIB  # a budget under this serves nothing but the smallest models: free the GPU instead
MIN_HALVED_MODEL_LEN = 1024  # --max-model-len is not halved below this: shorter would refuse ordinary prompts
SHARED_CARD_STEP = 2.0  # a budget under half the default is raised by this factor, not to the default
KV_MARGIN_RATIO = 0.05  # a larger budget leaves the KV cache at least this share of the card
NPU_ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"


def smaller_model_per_gpu(
    ledger: MemoryLedger, setup: Setup, weights_bytes: float, what: str, *, more_gpus: bool = True
) -> list[Recommendation]:
    """More GPUs (unless `more_gpus` is False), fewer bytes per weight, or weights in CPU memory, sized so the
    weights take at most 75 % of what each card gives vLLM. `weights_bytes` is per GPU today; `what` says where
    it comes from."""
    usable = ledger.usable_bytes
    remedies: list[Recommendation] = []
    current = max(1, setup.tensor_parallel_size)
    more_gpus = more_gpus and ledger.more_devices
    if more_gpus and usable is not None and usable > 0 and setup.tensor_parallel_unknown:
        # A size computed as if today's were 1 could be below it: a second pipeline stage doubles the GPUs
        # whatever today's tensor parallel size is.
        remedies.append(
            Recommendation(
                flag="--pipeline-parallel-size",
                value=2,
                why=(
                    f"the log's workers span several GPUs but it does not say how many: two pipeline stages halve "
                    f"what each holds, {gib(weights_bytes)} -> {gib(weights_bytes / 2)}, whatever today's "
                    "--tensor-parallel-size (or double that)"
                ),
            )
        )
    elif more_gpus and usable is not None and usable > 0:
        size = current * 2
        while size <= MAX_TENSOR_PARALLEL and weights_bytes * current / size > TARGET_WEIGHT_SHARE * usable:
            size *= 2
        if size <= MAX_TENSOR_PARALLEL:
            remedies.append(
                Recommendation(
                    flag="--tensor-parallel-size",
                    value=size,
                    why=(
                        f"{what}: {gib(weights_bytes * current)} of weights / {size} {ledger.unit}s = "
                        f"{gib(weights_bytes * current / size)} each, at most {TARGET_WEIGHT_SHARE:.0%} of the "
                        f"{gib(usable)} each {ledger.unit} gives vLLM, so activations and the KV cache have room "
                        "(a power of two that divides the model's attention heads; past 8, across nodes)"
                    ),
                )
            )
    fp8 = _fp8(ledger, setup, weights_bytes, usable)
    if fp8 is not None:
        remedies.append(fp8)
    if usable is not None and usable > 0 and ledger.more_devices:  # one Mac: its CPU memory is the same memory
        offload = math.ceil((weights_bytes - TARGET_WEIGHT_SHARE * usable) / GIB)
        if offload > 0:
            remedies.append(
                Recommendation(
                    flag="--cpu-offload-gb",
                    value=offload,
                    why=(
                        f"the slow way out: {gib(weights_bytes)} of weights - {TARGET_WEIGHT_SHARE:.0%} of "
                        f"{gib(usable)} = {(weights_bytes - TARGET_WEIGHT_SHARE * usable) / GIB:.2f}, rounded up -> "
                        f"{offload} GiB kept in CPU memory (every step reads them over PCIe)"
                    ),
                )
            )
    return remedies


def _fp8(ledger: MemoryLedger, setup: Setup, weights_bytes: float, usable: float | None) -> Recommendation | None:
    """fp8 weights, only where they are the way out: weights stated 16-bit (not already 8- or 4-bit by their
    quantization or name), half of them within 75 % of the card, and a GPU known to run fp8 (Ada, Hopper,
    Blackwell, MI300): a T4 or a V100 cannot, and the log rarely names the card."""
    if setup.quantization is not None or ledger.weights_bits != 16 or not ledger.fp8_capable:
        return None
    if usable is None or weights_bytes / 2 > TARGET_WEIGHT_SHARE * usable:
        return None
    return Recommendation(
        flag="--quantization",
        value="fp8",
        why=(
            f"fp8 weights take half of 16-bit ones: {gib(weights_bytes)} -> {gib(weights_bytes / 2)} per GPU, within "
            f"{TARGET_WEIGHT_SHARE:.0%} of {gib(usable)} ({ledger.gpu_name}: fp8-capable)"
        ),
    )


def budget_within_free(ledger: MemoryLedger) -> Recommendation | None:
    """The largest budget that fits beside the other processes, when it is below today's (or vLLM's default)."""
    total = ledger.total
    if total is None or ledger.others is None:
        return None
    computed = formula.utilization(int(total.value_bytes), int(ledger.others_bytes), 0)
    if computed.value >= ledger.utilization or computed.value < MIN_USEFUL_UTILIZATION:
        return None
    now = f"{ledger.utilization:g} ({ledger.utilization_source})"
    return Recommendation(
        flag="--gpu-memory-utilization",
        value=computed.value,
        why=f"{computed.why}: at most this, so the budget fits in what the other processes leave (today {now})",
    )


def leftover_budget(total_bytes: float, free_bytes: float, weights: Amount | None) -> Recommendation | None:
    """Other processes leave under a tenth of the card, so the 5 % reserve is theirs already: the budget that still
    passes vLLM's start check (budget x total <= free at start, less 1 % of the card for its context and rounding),
    for a model small enough to serve from it (an embedding model). None when nothing is left, or when the weights
    the log states do not fit in it."""
    if total_bytes <= 0:
        return None
    margin = LEFTOVER_MARGIN_RATIO * total_bytes
    value = formula.floor_hundredths((free_bytes - margin) / total_bytes)
    room = value * total_bytes
    if value < MIN_LEFTOVER_UTILIZATION or room < MIN_LEFTOVER_BYTES:
        return None
    if weights is not None and weights.value_bytes >= room:
        return None
    return Recommendation(
        flag="--gpu-memory-utilization",
        value=value,
        why=(
            f"({gib(free_bytes)} free - {gib(margin)} (1 % of the card)) / {gib(total_bytes)} = "
            f"{(free_bytes - margin) / total_bytes:.4f}, rounded down -> {value:.2f}: at most this, and only for a "
            f"model whose weights, activations and KV cache fit in {gib(room)} (an embedding or small model); "
            "otherwise free the GPU first"
        ),
    )


def lower_budget_for_transient(ledger: MemoryLedger, tried_bytes: int, free_bytes: int) -> Recommendation | None:
    """A budget lower by what a failed transient allocation lacked, plus 1 % of the card."""
    if ledger.total is None or ledger.total.value_bytes <= 0:
        return None
    shortfall = max(0, tried_bytes - free_bytes)
    computed = formula.utilization_for_transient(
        ledger.utilization, ledger.utilization_source, tried_bytes, shortfall, int(ledger.total.value_bytes)
    )
    return Recommendation(flag="--gpu-memory-utilization", value=computed.value, why=computed.why)


def raise_budget(
    ledger: MemoryLedger, needed_bytes: float | None, reason: str, *, current: float | None
) -> Recommendation | None:
    """A larger budget, within what the card has free: room for `needed_bytes` (weights and activations) plus 5 %
    of the card for the KV cache when the ledger says how much that is, else vLLM's default.
    `current` is today's budget when the log states it (None: not stated, the value is vLLM's default or more)."""
    total = ledger.total
    # Without the sizes, one step of the KV margin above today's budget (vLLM's default where the log does not
    # say it): recommending the default itself would repeat the likeliest configuration that just failed.
    base = current if current is not None else DEFAULT_UTILIZATION
    wanted = max(DEFAULT_UTILIZATION, base + KV_MARGIN_RATIO)
    step = f"one step of {KV_MARGIN_RATIO:.0%} of the card above " + (
        f"today's {current:g}" if current is not None else f"vLLM's default {DEFAULT_UTILIZATION:g}"
    )
    arithmetic = "the log does not say what the budget must hold; " + (
        f"{step} = {wanted:.2f}"
        if wanted == base + KV_MARGIN_RATIO
        else f"vLLM's default {DEFAULT_UTILIZATION:g}, above {step}"
    )
    if current is not None and current * SHARED_CARD_STEP < DEFAULT_UTILIZATION:
        # A budget set this far below the default was set for a reason: the card is shared (a trainer, another
        # vLLM). Doubling it is a measured step that stays clear of what they may hold; vLLM's default could ask
        # for memory they hold, and the next start's log says how much more the budget needs.
        wanted = max(current * SHARED_CARD_STEP, current + KV_MARGIN_RATIO)
        arithmetic = (
            f"the log does not say what the budget must hold; today's {current:g}, far below vLLM's default "
            f"{DEFAULT_UTILIZATION:g}, says the card is likely shared: doubled = {wanted:.2f}, a step clear of what "
            "the other tenant may hold (more once the next start logs its KV cache)"
        )
    scaled = _scaled_by_the_kv_shortfall(ledger, needed_bytes, current)
    if scaled is not None and scaled[0] < wanted:  # enough by that count; above the step, the step (it errs high)
        wanted, arithmetic = scaled
    if needed_bytes is not None and total is not None and total.value_bytes > 0:
        wanted = needed_bytes / total.value_bytes + KV_MARGIN_RATIO
        arithmetic = (
            f"({gib(needed_bytes)} + {KV_MARGIN_RATIO:.0%} of {gib(total.value_bytes)} for the KV cache) / "
            f"{gib(total.value_bytes)} = {wanted:.4f}"
        )
    limit = highest_budget(ledger)
    value = min(math.ceil(wanted * 100 - 1e-6) / 100, limit)
    if current is not None and value <= current:
        return None
    capped = f", capped at {limit:.2f} (what the card has free, less the reserve)" if value < wanted - 1e-9 else ""
    today = (
        f"today {current:g} ({ledger.utilization_source})"
        if current is not None
        else f"today's value is not in the log: below {DEFAULT_UTILIZATION:g}, {DEFAULT_UTILIZATION:g} first; if it is "
        "already this high, this is not the way out"
    )
    return Recommendation(
        flag="--gpu-memory-utilization",
        value=value,
        why=f"{reason}: {arithmetic}, rounded up -> {value:.2f}{capped}; {today}",
    )


def highest_budget(ledger: MemoryLedger) -> float:
    """The highest gpu_memory_utilization worth recommending: the device's, within what other processes leave."""
    ceiling, most = ledger.ceiling, ledger.max_utilization
    return min(most, formula.floor_hundredths(ceiling)) if ceiling is not None else most


def _scaled_by_the_kv_shortfall(
    ledger: MemoryLedger, needed_bytes: float | None, current: float | None
) -> tuple[float, str] | None:
    """Without the card's size, today's budget and a KV cache it left at or below zero still size the raise:
    today's budget held the weights (and what else the log states) plus that KV cache, so it must grow by the
    ratio of what it must hold to what it held, then take the KV margin. What the log omits (activations,
    non-torch memory) makes today's budget larger than counted, so the ratio errs high, never short; where it
    comes out above the step without it, the step is taken."""
    kv = ledger.kv
    if needed_bytes is None or current is None or kv is None or kv.value_bytes > 0:
        return None
    held = needed_bytes + kv.value_bytes  # today's budget in bytes, or less
    if held <= 0:
        return None
    wanted = current * needed_bytes / held + KV_MARGIN_RATIO
    arithmetic = (
        f"the card's size is not in the log, but today's budget held {gib(held)} or more (what it must hold, "
        f"{gib(needed_bytes)}, with a KV cache of {gib(kv.value_bytes)}): {current:g} x {gib(needed_bytes)} / "
        f"{gib(held)} + {KV_MARGIN_RATIO:.0%} of the card for the KV cache = {wanted:.4f}"
    )
    return wanted, arithmetic


def fewer_batched_tokens(setup: Setup, why: str) -> Recommendation | None:
    """Half of max_num_batched_tokens (a multiple of 256): the profile run's and a prefill step's peak."""
    current = setup.max_num_batched_tokens
    if current is None:
        return None
    halved = max(MIN_BATCHED_TOKENS, current.value // 2 // MIN_BATCHED_TOKENS * MIN_BATCHED_TOKENS)
    if halved >= current.value:
        return None
    return Recommendation(
        flag="--max-num-batched-tokens",
        value=halved,
        why=f"{why}: {current.value} ({current.source}) halved to a multiple of {MIN_BATCHED_TOKENS} -> {halved}",
    )


def fewer_sequences(seqs: int, source: str, why: str) -> Recommendation | None:
    if seqs <= 1:
        return None
    halved = seqs // 2
    return Recommendation(flag="--max-num-seqs", value=halved, why=f"{why}: {seqs} ({source}) / 2 -> {halved}")


def shorter_max_model_len(setup: Setup, why: str) -> Recommendation | None:
    """Half of max_model_len as the log states it, for a need that grows with it (not the KV cache's refusal,
    which sizes the length from the capacity it states)."""
    current = setup.max_model_len
    if current is None or current.value < 2 * MIN_HALVED_MODEL_LEN:
        return None
    halved = current.value // 2
    return Recommendation(flag="--max-model-len", value=halved, why=f"{why}: {current.value} ({current.source}) / 2")


def expandable_segments(why: str, device: str = "CUDA") -> Recommendation:
    """The allocator's setting for the device: torch_npu reads its own variable; CUDA and ROCm builds read
    PyTorch's."""
    flag = NPU_ALLOC_CONF if device == "NPU" else ALLOC_CONF
    return Recommendation(flag=flag, value=EXPANDABLE, why=why)


def sequences(setup: Setup, log: LogFacts, why: str) -> Recommendation | None:
    """Half of max_num_seqs as the arguments or vLLM's default state it (V0's 256 when the log shows V0)."""
    seqs = setup.max_num_seqs
    if seqs is not None:
        return fewer_sequences(seqs.value, seqs.source, why)
    if log.engine == "v0" and (setup.version is None or setup.version < (0, 8, 0)):
        return fewer_sequences(V0_MAX_NUM_SEQS, "V0's default, assumed: the log shows the V0 engine", why)
    return None


def without_graphs(log: LogFacts) -> Recommendation | None:
    """vLLM 0.2x profiles CUDA graphs' memory before it sizes the KV cache and keeps it out of the KV budget:
    without graphs, that memory goes to the KV cache (for some decode speed)."""
    if not log.graphs_profiled or (log.args is not None and log.args.enforce_eager):
        return None
    return Recommendation(
        flag="--enforce-eager",
        value="",
        why=(
            "vLLM profiled CUDA graphs' memory before sizing the KV cache and kept it out of the KV budget: "
            "without graphs that memory is the KV cache's (decoding runs slower)"
        ),
    )
