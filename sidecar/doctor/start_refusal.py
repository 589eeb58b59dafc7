"""vLLM's refusals to start, as its lines word them in each release: patterns and their handlers. Pure.

The KV cache's (one max_model_len request does not fit: V1's sizes and estimate, V0's capacity in tokens; no
memory for any block; V0's ignored prompt before 0.2.7), a hybrid model's state blocks, free memory below the
budget, the sampler's warm-up, and the memory profile's own check. `log_parser` matches each pattern; the handler
stores a `Refusal` in the parser's facts. The wordings were read in vLLM's sources of the releases they name.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.log_records import NUMBER, error_text, loose
from sidecar.doctor.logfacts import Facts, Refusal, RefusalKind

# 0.8.x printed "GB" for sizes it had divided by 2**30 (as the weights line did): both spellings are GiB.
MAX_LEN_V1 = loose(
    r"To serve at least one request with the model(?:s?'s)? max seq len \((\d+)\), \(?" + NUMBER + r" Gi?B KV cache is "
    # a paste can end after the available memory, or elide it ("2.0 GiB KV cache is needed ... estimated ...")
    r"needed(?:, which is larger than the available KV cache memory \(" + NUMBER + r" Gi?B\)\.?| \.\.\.(?= ))"
    # A paste may elide the sentence's start (`... the estimated maximum model length is 11656.`).
    r"(?: (?:\.\.\. )?(?:Based on the available memory, )?(?:the )?[Ee]stimated maximum model length is (\d+)\.)?"
)

# The refusal's last sentence, on a line of its own where a paste broke the message (capitalised, so not joined).
ESTIMATED_MAX_LEN = loose(r"(?:Based on the available memory, )?(?:the )?[Ee]stimated maximum model length is (\d+)")

MAX_LEN_V0 = loose(  # "max \w+ len": the rest of the sentence identifies it in a copy retyped by hand ("sew len")
    r"The model's max \w+ len \((\d+)\) is larger than the maximum number of tokens that can be"
    # an excerpt may end before the size (at the parenthesis, mid-word): the refusal is still known, its size not
    r"(?: stored in KV cache \((?:(\d+)\))?|\s?\S{0,20}$)"
)

NO_CACHE_MEMORY = loose(r"No available memory for the cache blocks")

# V0 before 0.2.7 started with a max_model_len its KV cache could not hold and ignored each such prompt.
PROMPT_OVER_KV = loose(r"Input prompt \((\d+) tokens\) is too long and exceeds the capacity of block_manager")

# A hybrid model's state (Mamba, linear attention) takes one block per running sequence, from the same budget as the
# KV cache (vllm/config/compilation.py, when it sizes CUDA graphs): "ValueError: max_num_seqs (1024) exceeds
# available Mamba cache blocks (854)".
STATE_BLOCKS = loose(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)")

FREE_AT_START = loose(  # a quote may stop at "less than desired": free and total still say what is left
    # (later releases leave out "on startup": "Free memory on device cuda:0 (X/Y GiB) is less than desired ...")
    r"Free memory on device(?: \S+)? \("
    + NUMBER
    + "/"
    + NUMBER
    + r" GiB\)(?: on startup)? is less than desired(?: GPU "
    r"memory utilization \(" + NUMBER + ", " + NUMBER + r" GiB\))?"
)

# The memory profile's own check (V0 worker.py 0.5-0.6, then V0/V1 gpu workers to 0.10+): "Error in memory
# profiling." alone (0.5), or with "Initial free memory X, current free memory Y" after it: bytes (0.6), GiB (0.7+).
PROFILE_CHECK = loose(
    r"Error in memory profiling\.(?: Initial free memory " + NUMBER + r"( GiB)?, current free memory " + NUMBER + ")?"
)

# The sampler's warm-up, and a pooling model's pooler's (0.10+: "warming up pooler (task='embed') with N dummy
# requests"): both run max_num_seqs dummy requests at once.
SAMPLER = loose(
    r"CUDA out of memory occurred when warming up (?:sampler|pooler(?: \([^)]*\))?) with (\d+) dummy requests"
)

# 0.32+ with weights held by another process (the IPC weight cache): they count against the budget, so the
# start check compares free memory with what the budget leaves the engine, and refuses a budget they exceed.
FREE_BESIDE_EXTERNAL = loose(
    r"Free memory on device(?: \S+)? \(" + NUMBER + "/" + NUMBER + r" GiB\)(?: on startup)? is less than the "
    r"engine's budget after excluding external process's weights \(" + NUMBER + ", " + NUMBER + r" GiB\)"
)
EXTERNAL_WEIGHTS = loose(
    r"Externally held weights on device(?: \S+)? \(" + NUMBER + "/" + NUMBER + r" GiB\) exceed the desired GPU "
    r"memory utilization \(" + NUMBER + ", " + NUMBER + r" GiB\)"
)

AVAILABLE_AT_START = loose(
    r"Available memory on device(?: \S+)? \(" + NUMBER + "/" + NUMBER + r" GiB\) is below required GPU memory "
    r"utilization \(" + NUMBER + ", " + NUMBER + r" GiB\)"
)


def max_len_v1(match: re.Match[str], facts: Facts) -> None:
    refusal = Refusal(
        kind=RefusalKind.MAX_LEN_EXCEEDS_KV,
        line=error_text(match),
        max_model_len=int(match.group(1)),
        needed_gib=float(match.group(2)),
        available_gib=float(match.group(3)) if match.group(3) else None,
        printed_half_unit_gib=max(_half_unit(match.group(2)), _half_unit(match.group(3) or match.group(2))),
        estimated_max_len=int(match.group(4)) if match.group(4) else None,
    )
    if not _looser_than_before(refusal, facts.get("refusal")):
        facts["refusal"] = refusal


def _looser_than_before(refusal: Refusal, before: object) -> bool:
    """Whether an earlier refusal of the same length in this start had less KV memory: ranks, or runs of one test,
    that refused the same length with different room. The length must fit the one with the least, so that one
    stays the refusal read."""
    if not isinstance(before, Refusal) or before.kind is not refusal.kind:
        return False
    if before.max_model_len != refusal.max_model_len or before.available_gib is None or refusal.available_gib is None:
        return False
    return before.available_gib < refusal.available_gib


def _half_unit(number: str) -> float:
    """The rounding error of a number as printed: 1.75 -> 0.005, 1.1 -> 0.05, 2 -> 0.5."""
    decimals = len(number.partition(".")[2])
    return 0.5 * 10.0**-decimals


def estimated_max_len(match: re.Match[str], facts: Facts) -> None:
    refusal = facts.get("refusal")
    if (
        isinstance(refusal, Refusal)
        and refusal.kind is RefusalKind.MAX_LEN_EXCEEDS_KV
        and refusal.estimated_max_len is None
        and refusal.needed_gib is not None  # V1's refusal: the sentence is the end of its message
    ):
        facts["refusal"] = replace(refusal, estimated_max_len=int(match.group(1)))


def max_len_v0(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(
        kind=RefusalKind.MAX_LEN_EXCEEDS_KV,
        line=error_text(match),
        max_model_len=int(match.group(1)),
        capacity_tokens=int(match.group(2)) if match.group(2) else None,
    )


def prompt_over_kv(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(
        kind=RefusalKind.PROMPT_OVER_KV, line=error_text(match, "Input prompt"), prompt_tokens=int(match.group(1))
    )


def state_blocks(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(
        kind=RefusalKind.STATE_BLOCKS,
        line=error_text(match),
        max_num_seqs=int(match.group(1)),
        state_blocks=int(match.group(2)),
    )


def no_cache(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(kind=RefusalKind.NO_CACHE_MEMORY, line=error_text(match))


def free_at_start(match: re.Match[str], facts: Facts) -> None:
    free, total, utilization, requested = (float(match.group(i)) if match.group(i) else None for i in range(1, 5))
    facts["refusal"] = Refusal(
        kind=RefusalKind.INSUFFICIENT_FREE_MEMORY,
        line=error_text(match),
        free_gib=free,
        total_gib=total,
        utilization=utilization,
        requested_gib=requested,
    )


def free_beside_external(match: re.Match[str], facts: Facts) -> None:
    """The engine's share is the budget less the weights another process holds: those are inside the budget."""
    free, total, utilization, engine = (float(match.group(i)) for i in range(1, 5))
    facts["refusal"] = Refusal(
        kind=RefusalKind.INSUFFICIENT_FREE_MEMORY,
        line=error_text(match),
        free_gib=free,
        total_gib=total,
        utilization=utilization,
        requested_gib=engine,
        external_weights_gib=max(0.0, utilization * total - engine),
    )


def external_weights(match: re.Match[str], facts: Facts) -> None:
    held, total, utilization, budget = (float(match.group(i)) for i in range(1, 5))
    facts["refusal"] = Refusal(
        kind=RefusalKind.EXTERNAL_WEIGHTS,
        line=error_text(match),
        external_weights_gib=held,
        total_gib=total,
        utilization=utilization,
        requested_gib=budget,
    )


def sampler(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(
        kind=RefusalKind.SAMPLER_WARMUP, line=error_text(match, "RuntimeError:"), dummy_requests=int(match.group(1))
    )


def profile_check(match: re.Match[str], facts: Facts) -> None:
    facts["refusal"] = Refusal(
        kind=RefusalKind.PROFILE_FREE_DID_NOT_FALL,
        line=error_text(match, "AssertionError:"),
        free_gib=_gib_or_bytes(match.group(1), in_gib=bool(match.group(2))),
        free_after_gib=_gib_or_bytes(match.group(3), in_gib=bool(match.group(2))),
    )


def _gib_or_bytes(number: str | None, *, in_gib: bool) -> float | None:
    if not number:
        return None
    value = float(number)
    return value if in_gib else value / 2**30
