"""Expected values the scenario table cannot state in advance, computed from the simulator's own answers.

Read independently of the doctor: /metrics through prometheus_client's parser, /sim/gpu as plain JSON. The
formulas are those docs/doctor.md states.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.doctor.scenarios import Oracle, Value

MIN_REQUESTS = 50
GIB = 2**30


def shutdown_timeout(metrics_text: str) -> int:
    """ceil10 of the bound of the bucket holding the p99 end-to-end latency; 120 with under 50 requests."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "vllm:e2e_request_latency_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    ordered = sorted(buckets.items())
    count = ordered[-1][1] if ordered else 0.0
    if count < MIN_REQUESTS:
        return 120
    finite = [bound for bound, _ in ordered if not math.isinf(bound)]
    upper = next(bound for bound, cumulative in ordered if cumulative >= 0.99 * count)
    if math.isinf(upper):
        upper = finite[-1]
    return max(10, math.ceil(upper / 10) * 10)


def gpu_expectations(gpu_document: dict[str, Any], utilization: float) -> tuple[float, str]:
    """(recommended --gpu-memory-utilization, severity) for GPU 0 as /sim/gpu shows it."""
    gpu = gpu_document["gpus"][0]
    total = gpu["total_bytes"]
    others = sum(p["used_bytes"] for p in gpu["processes"] if "VLLM" not in p["name"] and "vllm" not in p["name"])
    vllm = gpu["used_bytes"] - others
    over = vllm - utilization * total
    over = over if over > max(GIB, 0.02 * total) else 0.0
    value = math.floor((total - others - over - 0.05 * total) / total * 100 + 1e-6) / 100
    severity = "critical" if total - gpu["used_bytes"] < 0.05 * total else "warning"
    return value, severity


def resolve(value: Value | str, oracles: dict[Oracle, Value]) -> Value:
    return oracles[value] if isinstance(value, Oracle) else value
