"""The weights' size a model's name implies, for a log that never got to say it. Pure.

A crash while loading the weights (or a refusal before `Model loading took W GiB`) leaves the weights' size
out of the log; the name usually states the parameter count (`Qwen2.5-72B-Instruct`, `gemma-3-27b-it`,
`Mixtral-8x7B`, `Qwen3-30B-A3B`) and often the precision (`-AWQ`, `-GPTQ-Int4`, `-FP8`, `-bnb-4bit`). The
estimate is a range, never a point: a mixture of experts' `8x7B` shares its attention layers (Mixtral 8x7B
holds 46.7B, not 56B), and quantized checkpoints keep embeddings and norms at 16 bits. A decision that the
weights do not fit uses the low end; one that they fit uses the high end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 2**30
_EXPERTS = re.compile(r"(?<![\w.])(\d+)x(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")
_DENSE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")
_FOUR_BIT = re.compile(r"awq|gptq|int4|4bit|4-bit|w4a16|nvfp4|mxfp4|fp4|bnb|q4|gguf", re.IGNORECASE)
_EIGHT_BIT = re.compile(r"fp8|int8|8bit|8-bit|w8a8|w8a16|q8", re.IGNORECASE)
_SHARED_SHARE = 0.75  # at least this share of N x M parameters for an N x M mixture (Mixtral 46.7 / 56 = 0.83)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsEstimate:
    low_bytes: float  # the whole model, all GPUs together
    high_bytes: float
    why: str  # the arithmetic, for an evidence line


def estimate(model: str, *, dtype: str | None = None, quantization: str | None = None) -> WeightsEstimate | None:
    """The weights' size from the model's name and precision; None when the name states no parameter count."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    experts = _EXPERTS.search(name)
    if experts is not None:
        full = float(experts.group(1)) * float(experts.group(2))
        low_params, high_params = full * _SHARED_SHARE, full
        counted = f"{experts.group(0)}: {experts.group(1)} x {experts.group(2)}B = {full:g}B at most"
    else:
        sizes = [float(match.group(1)) for match in _DENSE.finditer(name)]
        if not sizes:
            return None
        params = max(sizes)  # Qwen3-30B-A3B: the total, not the active parameters
        low_params = high_params = params
        counted = f"{params:g}B parameters"
    low_per, high_per, precision = _bytes_per_parameter(name, dtype, quantization)
    low, high = low_params * 1e9 * low_per, high_params * 1e9 * high_per
    return WeightsEstimate(
        low_bytes=low,
        high_bytes=high,
        why=(
            f"{name} (the model's name): {counted} x {precision} = {low / GIB:.1f}"
            + (f"-{high / GIB:.1f}" if high - low > 0.05 * GIB else "")
            + " GiB of weights (estimated: the log does not say what loading took)"
        ),
    )


def _bytes_per_parameter(name: str, dtype: str | None, quantization: str | None) -> tuple[float, float, str]:
    said = " ".join(part for part in (name, quantization or "") if part)
    if _FOUR_BIT.search(said):
        return 0.5, 0.65, "0.5-0.65 bytes (4-bit weights, 16-bit embeddings)"
    if _EIGHT_BIT.search(said):
        return 1.0, 1.1, "1-1.1 bytes (8-bit weights)"
    if dtype is not None and "32" in dtype:
        return 4.0, 4.0, f"4 bytes ({dtype})"
    where = dtype or "16-bit, vLLM's default for these checkpoints"
    return 2.0, 2.0, f"2 bytes ({where})"
