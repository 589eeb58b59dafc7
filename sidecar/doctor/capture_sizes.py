"""Fewer CUDA graphs: the batch sizes vLLM captures, and half of them in the spelling each release takes. Pure.

The sizes come from the engine's config line (`"cudagraph_capture_sizes":[...]`, `"max_capture_size"` 0.7-0.10,
`"max_cudagraph_capture_size"` 0.11.2+), else from vLLM's default for the version, read in its source: 0.10.2+
`max = min(2 x max_num_seqs, 512)`, V1 0.8.x a fixed 512, capped by max_num_batched_tokens; the list is 1, 2, 4
then every 8 (0.8-0.10) or every 8 below 256 and every 16 from 256 (0.11+).
"""

from __future__ import annotations

import json

from sidecar.doctor.finding import Recommendation
from sidecar.doctor.logfacts import LogFacts
from sidecar.doctor.setup import Setup
from sidecar.doctor.versions import graph_sizes_flag

GRAPH_SIZE_CAP = 512  # vLLM's cap on its default largest capture size (V1, every release read)
MIN_CAPTURE_SIZE = 8  # below this a cap saves next to nothing: say --enforce-eager instead


def default_capture_sizes(largest: int, version: tuple[int, int, int]) -> list[int]:
    """The batch sizes vLLM captures up to `largest` by default (vllm/config: `_set_cudagraph_sizes`, read in
    0.8.5, 0.10.2, 0.11.2, 0.12.0 and 0.32.0): 1, 2, 4, then every 8 (0.8-0.10: every 8 to the largest; from
    0.11: every 8 below 256, every 16 from 256)."""
    sizes = [size for size in (1, 2, 4) if size <= largest]
    if version >= (0, 11, 0):
        sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    else:
        sizes += list(range(8, largest + 1, 8))
    return sizes


def _current_capture(setup: Setup, log: LogFacts) -> tuple[list[int], str] | None:
    """The sizes this vLLM captured and where that comes from: the engine's config line, else vLLM's default for
    the version from max_num_seqs (0.10.2+: min(2 x max_num_seqs, 512); V1 0.8.x: 512), capped by
    max_num_batched_tokens."""
    version = setup.version
    if log.capture_sizes:
        return list(log.capture_sizes), "the engine's config line (cudagraph_capture_sizes)"
    if version is None:
        return None
    if log.max_capture_size is not None:
        largest, source = log.max_capture_size, f"max capture size {log.max_capture_size} (the engine's config line)"
    elif version >= (0, 10, 2) and setup.max_num_seqs is not None:
        seqs = setup.max_num_seqs
        largest = min(2 * seqs.value, GRAPH_SIZE_CAP)
        source = f"vLLM's default: min(2 x max_num_seqs {seqs.value} ({seqs.source}), {GRAPH_SIZE_CAP}) = {largest}"
    elif (0, 8, 0) <= version < (0, 9, 0):
        largest, source = GRAPH_SIZE_CAP, f"vLLM {version[0]}.{version[1]}'s default largest size {GRAPH_SIZE_CAP}"
    else:
        return None
    batched = setup.max_num_batched_tokens
    if batched is not None and batched.value < largest:
        largest = batched.value
        source += f", capped by max_num_batched_tokens {batched.value}"
    return default_capture_sizes(largest, version), source


def fewer_graphs(setup: Setup, log: LogFacts, lines: list[str]) -> Recommendation | None:
    """Half the largest captured batch size, in the spelling this version takes (versions.graph_sizes_flag)."""
    flag = graph_sizes_flag(setup.version)
    current = _current_capture(setup, log)
    if flag is None or current is None or setup.version is None:
        lines.append(
            "fewer captured graph sizes cannot be sized from this log (no version, capture sizes or max_num_seqs): "
            "see --max-cudagraph-capture-size (0.11.2+), --cuda-graph-sizes (0.9-0.12) or --compilation-config"
        )
        return None
    sizes, source = current
    largest = sizes[-1]
    half = largest // 2 // MIN_CAPTURE_SIZE * MIN_CAPTURE_SIZE
    if half < MIN_CAPTURE_SIZE:
        return None
    kept = [size for size in sizes if size <= half] if log.capture_sizes else default_capture_sizes(half, setup.version)
    value: int | str = half
    if flag == "--compilation-config":
        value = json.dumps({"cudagraph_capture_sizes": kept}, separators=(",", ":"))
    return Recommendation(
        flag=flag,
        value=value,
        why=(
            f"or capture fewer graphs: {len(sizes)} batch sizes up to {largest} ({source}); the largest halved to "
            f"{half} keeps {len(kept)} of them, {len(kept) / len(sizes):.0%} of the graphs and the smaller ones "
            f"(their memory falls with their count and size); batches above {half} run without a graph"
        ),
    )


def fewer_or_no_graphs(
    setup: Setup, log: LogFacts, lines: list[str], *, eager_why: str, fewer: bool = True
) -> list[Recommendation]:
    """Fewer captured sizes (where `fewer`, and the log sizes them), then no graphs at all unless already eager."""
    found: list[Recommendation] = []
    halved = fewer_graphs(setup, log, lines) if fewer else None
    if halved is not None:
        found.append(halved)
    if not (log.args is not None and log.args.enforce_eager):
        found.append(Recommendation(flag="--enforce-eager", value="", why=eager_why))
    return found
