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
_NAME_ROUNDING = 1.1  # names round parameter counts down: Qwen2.5-14B has 14.8B, Qwen2.5-7B 7.6B, 72B 72.7B
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
        low_params, high_params = params, params * _NAME_ROUNDING  # "14B" holds 14.8B, "7B" 7.6B
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


def weight_bits(model: str | None, *, dtype: str | None, quantization: str | None) -> int | None:
    """4 or 8 when the name or the quantization says so; 16 when the dtype is stated 16-bit and nothing says
    quantized; None when nothing says."""
    said = " ".join(part for part in (model or "", quantization or "") if part)
    if _FOUR_BIT.search(said):
        return 4
    if _EIGHT_BIT.search(said):
        return 8
    if quantization is None and dtype is not None and ("16" in dtype or dtype in ("half", "auto")):
        return 16 if dtype != "auto" else None
    return None


# GPUs whose vLLM runs fp8 weights natively: Ada (L4, L40, RTX 40xx), Hopper (H100, H200, H20, H800, GH200),
# Blackwell (B100, B200, GB200, RTX 50xx, RTX PRO 6000), AMD MI300/MI325/MI350. A100 and older run fp8 through a
# slow fallback or not at all (T4, V100).
_FP8_GPU = re.compile(
    r"\b(?:H100|H200|H20|H800|GH200|B100|B200|GB200|GB300|B300|L4|L40S?|L20|RTX ?(?:40|50)\d\d|RTX PRO 6000|"
    r"RTX 6000 Ada|MI3[0-5]\d\w*)\b",
    re.IGNORECASE,
)


def fp8_capable(gpu_name: str | None) -> bool:
    return gpu_name is not None and _FP8_GPU.search(gpu_name) is not None


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
