"""Real traffic as vLLM's own histograms describe it: request sizes and latencies since vLLM started. Pure.

These are cumulative since vLLM's start, which is exactly the traffic the running configuration has served.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.doctor.histogram import (
    E2E_LATENCY,
    GENERATION_TOKENS,
    MAX_TOKENS_PARAM,
    PROMPT_TOKENS,
    Histogram,
    HistogramError,
    read_histogram,
)
from sidecar.model.exposition import Exposition


@dataclass(frozen=True, slots=True, kw_only=True)
class Traffic:
    prompt: Histogram
    generation: Histogram
    max_tokens: Histogram | None  # what clients asked for (0.6.6+)
    e2e_latency: Histogram | None

    @property
    def requests(self) -> int:
        """Finished requests: each one observes its prompt length once."""
        return self.prompt.count

    @property
    def mean_tokens(self) -> float | None:
        """Mean prompt + output tokens per request: what one request holds in the KV cache at its end."""
        if self.prompt.count <= 0:
            return None
        return (self.prompt.sum + self.generation.sum) / self.prompt.count


def read_traffic(exposition: Exposition, problems: list[str]) -> Traffic | None:
    """Traffic from the token histograms; None (and a problem line when they are broken) when not there."""
    try:
        prompt = read_histogram(exposition, PROMPT_TOKENS)
        generation = read_histogram(exposition, GENERATION_TOKENS)
        max_tokens = read_histogram(exposition, MAX_TOKENS_PARAM)
        e2e = read_histogram(exposition, E2E_LATENCY)
    except HistogramError as error:
        problems.append(f"vLLM's request histograms are inconsistent ({error}): traffic sizes unknown")
        return None
    if prompt is None or generation is None:
        problems.append(f"vLLM /metrics has no {PROMPT_TOKENS} / {GENERATION_TOKENS}: traffic sizes unknown")
        return None
    return Traffic(prompt=prompt, generation=generation, max_tokens=max_tokens, e2e_latency=e2e)
