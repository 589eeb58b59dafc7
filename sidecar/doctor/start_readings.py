"""vLLM's refusals to start, read against the memory ledger: the KV cache's length. Pure.

* One max_model_len request does not fit the KV cache (the refusal, or `# GPU blocks` x block size below
  max_model_len before a traceback): a shorter `--max-model-len` (what the cache holds, when that is at least a
  real request's 256 tokens), or more KV memory where the card has it. A KV cache smaller than that is no KV
  cache at all, where the weights decide (kv_room.py).
* A hybrid model's state blocks fewer than max_num_seqs; V0's ignored prompt longer than the whole KV cache.

The start checks on the card's free memory have a module of their own (start_checks.py), as has the sampler's
warm-up (sampler.py).
"""

from __future__ import annotations

import math

from sidecar.doctor.blowout import DEFAULT_BLOCK_SIZE, derived_max_len
from sidecar.doctor.cpu_kv import space_for_length
from sidecar.doctor.finding import Cause, Finding, Recommendation, Severity
from sidecar.doctor.formula import GIB, MIB, gib, tokens
from sidecar.doctor.ledger import MemoryLedger
from sidecar.doctor.logfacts import LogFacts, Refusal, RefusalKind
from sidecar.doctor.remedies import without_graphs
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import available

# A length scaled from the refusal's two sizes (no estimate printed) is an upper bound: the part of the KV cache
# that does not grow with the length (sliding-window layers, a draft model's cache) fits fewer tokens than the
# scaling assumes. This much of it is recommended; vLLM's own estimate (0.9+) needs no such margin.
SCALED_LENGTH_SHARE = 0.95
MIN_REQUEST_TOKENS = 256  # a KV cache that holds less than one such request is a sliver: the model is the problem


def kv_refusal(refusal: Refusal | None, ledger: MemoryLedger, setup: Setup, log: LogFacts) -> Finding | None:
    """One max_model_len request does not fit the KV cache; None when the KV cache is a sliver (no_kv_room)."""
    if refusal is not None and refusal.kind is not RefusalKind.MAX_LEN_EXCEEDS_KV:
        return None
    fits = derived_max_len(refusal) if refusal is not None else ledger.kv_tokens
    wanted = (refusal.max_model_len if refusal is not None else None) or (
        setup.max_model_len.value if setup.max_model_len is not None else None
    )
    if refusal is not None and fits is None:
        return _capacity_cut(refusal, ledger, wanted)
    if fits is None or fits < MIN_REQUEST_TOKENS:
        return None  # a sliver: the model or the budget is the problem, not max_model_len (no_kv_room)
    scaled = refusal is not None and refusal.estimated_max_len is None and refusal.capacity_tokens is None
    safe = math.floor(fits * SCALED_LENGTH_SHARE) if scaled else fits
    block, value = _to_blocks(safe, setup)
    if refusal is not None:
        lines = [f"vLLM refused to start: {refusal.line}"]
        where = _where(refusal)
    else:
        limit = (
            f"max_model_len is {tokens(wanted)} ({setup.max_model_len.source})"
            if wanted is not None and setup.max_model_len is not None
            else "the traceback runs through vLLM's check that it holds one max_model_len request"
        )
        lines = [
            f"the KV cache holds {tokens(fits)} tokens ({ledger.kv_tokens_source}) and {limit}: vLLM refuses to "
            "start when one request of max_model_len does not fit (the refusal's own text is not in the log)"
        ]
        where = "KV capacity"
    lines.extend(ledger.lines())
    recommendations = [
        Recommendation(
            flag="--max-model-len",
            value=value,
            why=(
                f"vLLM's {where}: {tokens(fits)} tokens"
                + (
                    f" at most; {SCALED_LENGTH_SHARE:.0%} of it, {tokens(safe)}, since any part of the KV cache that "
                    "does not grow with the length (sliding-window layers, a draft model's cache) makes the length "
                    "that fits shorter than the scaled one"
                    if scaled
                    else ""
                )
                + f", rounded down to the block size {block} -> {value}"
            ),
        )
    ]
    if wanted is not None:
        recommendations.extend(_more_kv(refusal, ledger, setup, log, wanted=wanted, fits=fits, lines=lines))
    said = f" {tokens(wanted)}" if wanted is not None else ""
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=f"vLLM could not start: max_model_len{said} is more than its KV cache holds ({tokens(fits)} tokens)",
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
    )


def _capacity_cut(refusal: Refusal, ledger: MemoryLedger, wanted: int | None) -> Finding:
    """The refusal's words with its count of tokens cut off (an excerpt that ends at the parenthesis): the cause is
    known, the length that fits is not, and no number is made up for it."""
    said = f" {tokens(wanted)}" if wanted is not None else ""
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=f"vLLM could not start: max_model_len{said} is more than its KV cache holds",
        evidence=(f"vLLM refused to start: {refusal.line}", *ledger.lines()),
        steps=(
            "the refusal's end, cut from this log, says how many tokens the KV cache holds: set --max-model-len at "
            "most that, rounded down to the block size (16), or give the KV cache more memory (a larger "
            "--gpu-memory-utilization up to 0.95 where the card has room, --kv-cache-dtype fp8, or more GPUs)",
        ),
    )


def state_blocks(refusal: Refusal) -> Finding:
    """A hybrid model keeps one state block per running sequence (Mamba, linear attention), taken from the same
    budget as the KV cache: vLLM refuses a max_num_seqs above the blocks there are."""
    asked, blocks = refusal.max_num_seqs or 0, refusal.state_blocks or 0
    recommendations = (
        (
            Recommendation(
                flag="--max-num-seqs",
                value=blocks,
                why=f"one state block per running sequence: {blocks} blocks -> at most {blocks} sequences",
            ),
        )
        if blocks >= 1
        else ()
    )
    return Finding(
        cause=Cause.CONCURRENCY_MISJUDGEMENT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM could not start: max_num_seqs {asked} is more than the {blocks} state blocks this hybrid model has"
        ),
        evidence=(f"vLLM refused to start: {refusal.line}",),
        recommendations=recommendations,
        steps=(
            "or keep the sequences and give the blocks more memory: they come out of the same budget as the KV "
            "cache (--gpu-memory-utilization, within what the card has free)",
        ),
    )


def prompt_over_kv(refusal: Refusal, ledger: MemoryLedger, setup: Setup) -> Finding:
    """V0 before 0.2.7 started with a max_model_len its KV cache could not hold, and ignored each prompt longer
    than the whole cache (finished with no output): the start-time refusal of later releases, one request late."""
    prompt = refusal.prompt_tokens or 0
    limit = setup.max_model_len
    said = f" {tokens(limit.value)} ({limit.source})" if limit is not None else ""
    lines = [f"vLLM ignored a request: {refusal.line} (finished with no output)", *ledger.lines()]
    fits = ledger.kv_tokens
    recommendations: list[Recommendation] = []
    steps: tuple[str, ...] = ()
    if fits is not None and fits >= MIN_REQUEST_TOKENS:
        block, value = _to_blocks(fits, setup)
        why = (
            f"the KV cache holds {tokens(fits)} tokens ({ledger.kv_tokens_source}), rounded down to {block} -> {value}"
        )
        recommendations.append(Recommendation(flag="--max-model-len", value=value, why=why))
    else:
        steps = (
            "find '# GPU blocks: N' among vLLM's start lines: the KV cache holds N x the block size (16) tokens, "
            f"fewer than {tokens(prompt)}; set --max-model-len at most that, or give the KV cache more memory: "
            "--gpu-memory-utilization up to 0.95, or --tensor-parallel-size to split the weights over more GPUs",
        )
    return Finding(
        cause=Cause.KV_CACHE_BLOWOUT,
        severity=Severity.CRITICAL,
        summary=(
            f"vLLM's KV cache holds fewer than {tokens(prompt)} tokens: it ignored a prompt that long, which "
            f"max_model_len{said} let in"
        ),
        evidence=tuple(lines),
        recommendations=tuple(recommendations),
        steps=steps,
    )


def _to_blocks(tokens: int, setup: Setup) -> tuple[int, int]:
    """The block size and `tokens` rounded down to it: a length the KV cache holds whole blocks of."""
    block = setup.block_size.value if setup.block_size is not None else DEFAULT_BLOCK_SIZE
    return block, tokens // block * block


def _where(refusal: Refusal) -> str:
    if refusal.estimated_max_len is not None:
        return "estimate of the longest request its KV cache holds"
    if refusal.capacity_tokens is not None:
        return "KV capacity"
    error = refusal.printed_half_unit_gib
    return (
        f"numbers (no estimate in the log): {refusal.max_model_len:,} tokens x {refusal.available_gib:g} GiB "
        f"available / {refusal.needed_gib:g} GiB needed, each at the end of its printed rounding (+-{error:g} GiB) "
        "that fits fewer, the KV cache growing linearly with the length"
    )


def _more_kv(
    refusal: Refusal | None,
    ledger: MemoryLedger,
    setup: Setup,
    log: LogFacts,
    *,
    wanted: int,
    fits: int,
    lines: list[str],
) -> list[Recommendation]:
    """The other ways out: a KV cache large enough for max_model_len where the card allows it."""
    out: list[Recommendation] = []
    args = log.args
    if (
        args is not None
        and args.kv_cache_memory_bytes is not None
        and available("--kv-cache-memory-bytes", setup.version)
    ):
        needed = args.kv_cache_memory_bytes * wanted / fits
        value = math.ceil(needed / MIB) * MIB
        out.append(
            Recommendation(
                flag="--kv-cache-memory-bytes",
                value=value,
                why=(
                    f"or keep max_model_len: {args.kv_cache_memory_bytes:,} bytes x {wanted:,} / {fits:,} tokens "
                    f"= {needed:,.0f} bytes, rounded up to a whole MiB -> {value}"
                ),
            )
        )
    elif log.cpu_kv_space is not None:  # the budget does not size an explicit CPU KV space: grow the space
        grown = space_for_length(log.cpu_kv_space, wanted, fits)
        if grown is not None:
            out.append(grown)
    elif refusal is not None and refusal.needed_gib is not None and refusal.available_gib is not None:
        raised = _raise_for_kv(refusal, ledger, lines)
        if raised is not None:
            out.append(raised)
    eager = without_graphs(log)
    if eager is not None:
        out.append(eager)
    if setup.kv_cache_dtype in (None, "auto") and 2 * fits >= wanted:
        out.append(
            Recommendation(
                flag="--kv-cache-dtype",
                value="fp8",
                why=f"or keep max_model_len: an fp8 KV cache holds twice the tokens, {tokens(2 * fits)} >= "
                f"{tokens(wanted)}",
            )
        )
    return out


def _raise_for_kv(refusal: Refusal, ledger: MemoryLedger, lines: list[str]) -> Recommendation | None:
    total = ledger.total
    if total is None or refusal.needed_gib is None or refusal.available_gib is None or ledger.utilization_assumed:
        if total is None:
            lines.append("the GPU's total memory is not in the log: a larger --gpu-memory-utilization is not sized")
        return None
    missing = (refusal.needed_gib - refusal.available_gib) * GIB
    raised = math.ceil((ledger.utilization + missing / total.value_bytes) * 100 - 1e-6) / 100
    ceiling = ledger.ceiling
    if raised > ledger.max_utilization or (ceiling is not None and raised > ceiling):
        lines.append(
            f"a KV cache for max_model_len would need gpu_memory_utilization {raised:.2f}: the card cannot give it"
        )
        return None
    return Recommendation(
        flag="--gpu-memory-utilization",
        value=raised,
        why=(
            f"or keep max_model_len: {ledger.utilization:g} + ({refusal.needed_gib:.2f} - {refusal.available_gib:.2f} "
            f"GiB missing) / {gib(total.value_bytes)} = {ledger.utilization + missing / total.value_bytes:.4f}, "
            f"rounded up -> {raised:.2f}"
        ),
    )
