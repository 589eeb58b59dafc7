"""A seeded closed-loop client: which requests to send so that a LoadShape's concurrency is in flight. Pure.

Used by the tests (and usable by a demo driver) to reproduce a scenario's calibrated load exactly: the same seed
gives the same prompts, so the same run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sidecar.sim.request import VOCAB_SIZE
from sidecar.sim.scenarios import LoadShape


@dataclass(frozen=True, slots=True, kw_only=True)
class NewRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


class ClosedLoopLoad:
    def __init__(self, shape: LoadShape, *, seed: int = 0, start_s: float = 0.0) -> None:
        self.shape = shape
        self._rng = random.Random(seed)  # noqa: S311 - reproducible load, not security
        self._seed = seed
        self._start_s = start_s
        self._sent = 0
        self._prefixes: dict[int, tuple[int, ...]] = {}

    @property
    def sent(self) -> int:
        return self._sent

    def due(self, now_s: float, in_flight: int) -> list[NewRequest]:
        """The requests to send now so that the shape's concurrency at `now_s` is in flight."""
        target = self.shape.concurrency_at(now_s - self._start_s)
        return [self._next() for _ in range(max(0, target - in_flight))]

    def _next(self) -> NewRequest:
        shape = self.shape
        length = shape.prompt_tokens
        if shape.prompt_jitter_tokens:
            length += self._rng.randint(-shape.prompt_jitter_tokens, shape.prompt_jitter_tokens)
        prefix: tuple[int, ...] = ()
        if shape.prefix_groups > 0:
            prefix = self._prefix(self._rng.randrange(shape.prefix_groups))
        suffix = tuple(self._rng.randrange(VOCAB_SIZE) for _ in range(length - len(prefix)))
        self._sent += 1
        return NewRequest(
            request_id=f"cmpl-sim-{self._seed}-{self._sent}",
            prompt_token_ids=prefix + suffix,
            max_tokens=shape.max_tokens,
        )

    def _prefix(self, group: int) -> tuple[int, ...]:
        if group not in self._prefixes:
            rng = random.Random(self._seed * 1_000_003 + group)  # noqa: S311 - reproducible prompts
            self._prefixes[group] = tuple(rng.randrange(VOCAB_SIZE) for _ in range(self.shape.prefix_tokens))
        return self._prefixes[group]
