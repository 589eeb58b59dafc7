"""The card a log does not name, read from the budget it shows: the smallest common card that holds it. Pure.

When vLLM refuses to start for want of KV cache memory, the log often states the weights and the (negative) KV
budget but not the card. The budget held weights + activations + KV = utilization x total, and activations are at
least `MIN_ACTIVATION_BYTES`, so total >= (weights + KV + MIN_ACTIVATION_BYTES) / utilization; the card also held
the weights. GPUs come in a few sizes, and a start that fails by a little is on the smallest card the numbers
allow: on the next size up the profile run would have taken gigabytes more than any text model's does. The
reading takes that smallest card, says it assumed it, and asks what the highest budget would leave the KV cache.

Only where the log states the budget (its arguments, or their absence from vLLM's non-default ones) and the
weights are the bulk of it: a shortfall larger than a third of the weights means activations, CUDA graphs or
another process ate the budget, and those say nothing about the card's size.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import MemoryLedger

# What PyTorch reports as the total of common cards, in GiB: 8, 10, 11, 12, 16, 20 GB; the L4; 24, 32, 40, 48 GB
# (the A6000 and L40S report 44.5); 80 GB; the H100 NVL's 94; the H200; the B200.
CARD_SIZES_GIB = (7.79, 9.77, 10.75, 11.72, 15.99, 19.99, 22.05, 23.65, 31.36, 39.39, 44.52, 79.11, 93.1, 139.8, 178.4)
MIN_ACTIVATION_BYTES = 0.5 * GIB  # the CUDA context and the smallest profile run together take at least this
WEIGHTS_SHARE_OF_SHORTFALL = 3  # the reading holds while the KV shortfall is at most a third of the weights


@dataclass(frozen=True, slots=True, kw_only=True)
class LikelyCard:
    total_bytes: float
    kv_at_bytes: float  # the KV cache on that card at the budget `likely_card` was asked about
    why: str


def likely_card(ledger: MemoryLedger, highest_utilization: float) -> LikelyCard | None:
    """The smallest common card that holds what the ledger shows, and the KV cache it would have at
    `highest_utilization`; None where the log names the card, or the weights do not make up the budget."""
    weights, kv = ledger.weights, ledger.kv
    if ledger.total is not None or ledger.others is not None or weights is None or weights.assumed or kv is None:
        return None
    if ledger.utilization_assumed:  # an excerpt without vLLM's arguments: 0.15 on a 120 GiB card reads the same
        return None
    if not 0 < ledger.utilization < highest_utilization:  # a budget of 0 (a garbled line) sizes nothing
        return None
    shortfall = -kv.value_bytes
    if shortfall <= 0 or shortfall * WEIGHTS_SHARE_OF_SHORTFALL > weights.value_bytes:
        return None
    held = weights.value_bytes + kv.value_bytes + MIN_ACTIVATION_BYTES  # the least the budget can have held
    floor = max(held / ledger.utilization, weights.value_bytes + MIN_ACTIVATION_BYTES)
    card = next((size * GIB for size in CARD_SIZES_GIB if size * GIB >= floor), None)
    if card is None:
        return None
    kv_at = (highest_utilization - ledger.utilization) * card + kv.value_bytes
    why = (
        f"the card's size is not in the log: the budget held at least {gib(held)} (weights {gib(weights.value_bytes)} "
        f"- {gib(shortfall)} short + {gib(MIN_ACTIVATION_BYTES)} of context and activations) at "
        f"gpu_memory_utilization {ledger.utilization:g} ({ledger.utilization_source}), so the card has at least "
        f"{gib(floor)}; the smallest common card that does is {gib(card)}, assumed. There, {highest_utilization:g} "
        f"would leave the KV cache ({highest_utilization:g} - {ledger.utilization:g}) x {gib(card)} - "
        f"{gib(shortfall)} = {gib(kv_at)}"
    )
    return LikelyCard(total_bytes=card, kv_at_bytes=kv_at, why=why)
