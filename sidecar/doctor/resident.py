"""A weight load that failed in a process already holding far more than the weights: not the model's size. Pure.

vLLM's weights are measured only once a load finishes (`Model loading took W GiB`), so a weight-loading error
after such a line belongs to a later load in the same log. When the process then holds more than those weights
twice over, what fills the card was there before this load began: an earlier engine that was never freed (a
second `LLM()` in a notebook or a retry loop keeps the first one's whole budget), a trainer's model beside a
colocated vLLM, or tensors of the program around it. More GPUs, quantization or CPU offload size the weights,
which fit: they change the wrong thing.
"""

from __future__ import annotations

from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.formula import GIB, gib
from sidecar.doctor.ledger import FITS_SHARE, MemoryLedger
from sidecar.doctor.logfacts import CudaOom, LogFacts
from sidecar.doctor.phase import RAN_OUT

_SLACK_BYTES = 2 * GIB  # the CUDA context, the load's own buffers: held beyond the weights by any load


def resident_beyond_weights(oom: CudaOom, ledger: MemoryLedger, log: LogFacts) -> float | None:
    """What the process held beyond the weights an earlier load of the same model measured, at a weight-loading
    error, when that is more than the weights themselves (and some slack) and they fit the card; else None."""
    held = oom.held_bytes
    total = ledger.total
    if log.earlier_weights_gib is None or held is None or total is None:
        return None
    weights = log.earlier_weights_gib * GIB
    if weights > FITS_SHARE * total.value_bytes:
        return None
    beyond = held - weights
    return beyond if beyond > weights + _SLACK_BYTES else None


def resident_memory(log: LogFacts, beyond: float, lines: list[str]) -> Finding:
    lines.append(
        f"this process held {gib(beyond)} beyond the {log.earlier_weights_gib:g} GiB of weights an earlier start "
        "of the same model measured in this log: memory that was there before this load began, not the model's "
        "size (the weights fit the card; more GPUs, quantization or offload change the wrong thing)"
    )
    return Finding(
        cause=Cause.CONFIGURATION_OVERSHOOT,
        severity=Severity.CRITICAL,
        summary=f"{RAN_OUT} while loading the model's weights: the process already held the card for something else",
        evidence=tuple(lines),
        steps=(
            "free what the process holds before the load: an earlier engine (del the LLM object, gc.collect(), "
            "torch.cuda.empty_cache(); in a notebook, restart the kernel), or a trainer's model beside a colocated "
            "vLLM (offload or sleep it first)",
            "or run every engine the process keeps with a budget that fits beside the others: their "
            "--gpu-memory-utilization values together stay under the card's 0.9 or so (two engines: about 0.45 each)",
        ),
    )
