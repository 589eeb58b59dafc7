"""A request as the simulated engine tracks it, and vLLM's validation of a new one. Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sidecar.sim.config import SimConfig

VOCAB_SIZE = 32000


class RequestRejectedError(ValueError):
    """The server refuses a request before it reaches the engine (vLLM answers HTTP 400 with this message)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True, kw_only=True, eq=False)
class SequenceState:
    """One sequence of a request (n > 1 fans out into n sequences sharing the prompt). Mutable, compared by identity."""

    request: RequestState
    index: int
    tokens: list[int]  # prompt, then the generated tokens
    num_computed: int = 0  # tokens whose KV is in the cache (or scheduled into it this step)
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    num_preemptions: int = 0
    cached_tokens: int = 0
    prefix_counted: bool = False
    finished: bool = False


@dataclass(slots=True, kw_only=True, eq=False)
class RequestState:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    token_seed: int
    sequences: list[SequenceState] = field(default_factory=list)


def check_request(config: SimConfig, prompt_token_ids: Sequence[int], max_tokens: int, n: int) -> None:
    """vLLM's validation of a request, with its messages."""
    prompt = len(prompt_token_ids)
    if prompt == 0:
        raise RequestRejectedError("The decoder prompt cannot be empty")
    if max_tokens < 1:
        raise RequestRejectedError(f"max_tokens must be at least 1, got {max_tokens}.")
    if n < 1:
        raise RequestRejectedError(f"n must be at least 1, got {n}.")
    if prompt + max_tokens > config.max_model_len:
        raise RequestRejectedError(
            f"This model's maximum context length is {config.max_model_len} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion."
        )
