"""One parsed Prometheus text exposition: samples grouped by sample name. Pure data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
"""Label pairs in the order the exposition wrote them (prometheus_client writes them sorted)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        for name, value in self.labels:
            if name == key:
                return value
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Exposition:
    """Samples by sample name (`vllm:prompt_tokens_total`, `..._bucket`), plus the declared family types."""

    samples: dict[str, tuple[Sample, ...]]
    types: dict[str, str] = field(default_factory=dict)
    names_seen: frozenset[str] = frozenset()  # every sample name in the text, kept or not

    def get(self, name: str) -> tuple[Sample, ...]:
        return self.samples.get(name, ())

    def has_name_with_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.names_seen)
