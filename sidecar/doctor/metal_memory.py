"""vllm-metal's own KV refusal (vLLM's Apple Silicon plugin): its budget breakdown read as a memory ledger.

The plugin refuses a start whose KV budget is not positive, in its own words and with its own arithmetic
("Paged attention: not enough Metal memory for KV cache. metal_limit=L GB, fraction=U, usable_metal=B GB,
model_memory=W GB, overhead=O GB, [kv_budget_before_hybrid=K0 GB, hybrid_gdn_state=lazy (growth_peak_reserve=R
GB, ...max_num_seqs=N),] kv_budget=K GB. Mitigations: increase VLLM_METAL_MEMORY_FRACTION | --gpu-memory-utilization
..."). Amounts are in decimal GB (bytes / 1e9). `B = U x L` is the budget; `K = B - W - O - R`, where R is the
state a hybrid (linear-attention) model keeps per sequence, for max_num_seqs sequences. Older releases subtract
that state without naming it: then it is what the breakdown does not add up to. Which knob sets the fraction
(an environment variable in older releases, `--gpu-memory-utilization` in later ones) is the one the plugin's
mitigation names.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.log_records import error_text, loose
from sidecar.doctor.logfacts import Facts, MemoryProfile, Refusal, RefusalKind

GB = 1e9
METAL_FRACTION_ENV = "VLLM_METAL_MEMORY_FRACTION"
_UNNAMED_STATE_GB = 0.05  # less than this missing from the sum is the breakdown's rounding, not a state reserve

METAL_KV_REFUSAL = loose(
    r"not enough Metal memory for KV cache\. ?metal_limit=([\d.]+)GB, fraction=([\d.]+), usable_metal=([\d.]+)GB, "
    r"model_memory=([\d.]+)GB, overhead=([\d.]+)GB"
    r"(?:, kv_budget_before_hybrid=(-?[\d.]+)GB)?"
    r"(?:, hybrid_gdn_state=\w+ \(growth_peak_reserve=([\d.]+)GB, [^)]*?max_num_seqs=(\d+)\))?"
    r", kv_budget=(-?[\d.]+)GB"
)
MITIGATION_NAMES_ENV = re.compile(r"Mitigations: increase " + METAL_FRACTION_ENV)
_GIB = 1024**3


def metal_kv_refusal(match: re.Match[str], facts: Facts) -> None:
    limit, fraction, usable, weights, overhead = (float(match.group(i)) for i in range(1, 6))
    reserve_named = match.group(7)
    seqs = int(match.group(8)) if match.group(8) else None
    kv = float(match.group(9))
    unnamed = usable - weights - overhead - kv  # what the breakdown does not add up to: an unnamed state reserve
    reserve = float(reserve_named) if reserve_named is not None else unnamed
    facts["refusal"] = Refusal(
        kind=RefusalKind.NO_CACHE_MEMORY,
        line=error_text(match),
        max_num_seqs=seqs,
        state_reserve_gib=reserve * GB / _GIB if reserve >= _UNNAMED_STATE_GB else None,
    )
    facts["metal_refusal"] = True
    facts["profile"] = MemoryProfile(
        total_gib=limit * GB / _GIB,
        utilization=fraction,
        budget_gib=usable * GB / _GIB,
        weights_gib=weights * GB / _GIB,
        activation_gib=None,
        non_torch_gib=overhead * GB / _GIB,
        kv_gib=kv * GB / _GIB,
        source="vllm-metal's refusal",
    )
    facts.setdefault("weights_gib", weights * GB / _GIB)


def metal_mitigation(_: re.Match[str], facts: Facts) -> None:
    """The mitigation (on the refusal's line or the next) names the knob: the environment variable in the releases
    that read it; a later release names --gpu-memory-utilization, the default here."""
    refusal = facts.get("refusal")
    if facts.get("metal_refusal") and isinstance(refusal, Refusal):
        facts["refusal"] = replace(refusal, budget_env=METAL_FRACTION_ENV)
