"""vllm-metal's own KV refusal (Apple Silicon): its breakdown read as a ledger, the knob its mitigation names, a
hybrid model's per-sequence state, and weights that leave the highest budget a sliver. Lines in the plugin's
format (vllm_metal's `_PagedAttentionPlan.format_breakdown` and its older inline message); the amounts are made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
REFUSAL = "ValueError: Paged attention: not enough Metal memory for KV cache. "


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def _said(finding: Finding) -> dict[str, object]:
    return {r.flag: r.value for r in finding.recommendations}


def test_a_budget_below_the_weights_raises_the_variable_the_mitigation_names_wrapped_as_posted() -> None:
    log = "\n".join(
        [
            REFUSAL,
            "metal_limit=16.00GB, fraction=0.4, usable_metal=6.40GB,",
            "model_memory=4.80GB, overhead=2.00GB, kv_budget=-0.40GB.",
            "Mitigations: increase VLLM_METAL_MEMORY_FRACTION; use a smaller or more",
            "quantized model.",
        ]
    )
    finding = _finding(log)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # (6.40 + 0.40 GB the budget held) / 16.00 GB + 5 % for a KV cache = 0.475 -> 0.48
    assert _said(finding) == {"VLLM_METAL_MEMORY_FRACTION": 0.48}


def test_a_later_plugin_that_names_the_flag_is_told_the_flag() -> None:
    line = (
        "Paged attention: not enough Metal memory for KV cache. metal_limit=10.00GB, fraction=0.05, "
        "usable_metal=0.50GB, model_memory=0.30GB, overhead=0.40GB, kv_budget=-0.20GB. Mitigations: increase "
        "--gpu-memory-utilization (currently 0.05); use a smaller or more quantized model."
    )
    finding = _finding(line)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # (0.50 + 0.20) / 10.00 + 5 % = 0.12
    assert _said(finding) == {"--gpu-memory-utilization": 0.12}


def test_a_state_reserve_the_breakdown_does_not_name_is_given_back_by_fewer_sequences() -> None:
    """Older releases subtract a hybrid model's per-sequence state without naming it: 6.00 - 4.00 - 1.00 leaves
    1.00 GB, yet the KV budget is -7.00 GB, so 8.00 GB went to the state of (vLLM's default) 256 sequences."""
    line = (
        f"{REFUSAL}metal_limit=6.25GB, fraction=0.96, usable_metal=6.00GB, model_memory=4.00GB, overhead=1.00GB, "
        "kv_budget=-7.00GB. Mitigations: increase VLLM_METAL_MEMORY_FRACTION, use a smaller or more quantized model."
    )
    finding = _finding(line)
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    # 8.00 GB / 256 = 31.25 MB a sequence; half of the 1.00 GB left / 31.25 MB = 16 -> 16
    assert _said(finding) == {"--max-num-seqs": 16}


def test_a_named_state_reserve_with_the_budget_short_before_it_raises_the_budget_first() -> None:
    line = (
        f"{REFUSAL}metal_limit=20.00GB, fraction=0.5, usable_metal=10.00GB, model_memory=8.00GB, overhead=2.50GB, "
        "kv_budget_before_hybrid=-0.50GB, hybrid_gdn_state=lazy (growth_peak_reserve=0.20GB, 50.0MB/seq * "
        "peak_slots=4/max_num_seqs=256), kv_budget=-0.70GB. Mitigations: increase VLLM_METAL_MEMORY_FRACTION; use a "
        "smaller or more quantized model; lower --max-num-seqs (for single-user serving, try --max-num-seqs 1)."
    )
    finding = _finding(line)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # (10.00 + 0.70) / 20.00 + 5 % = 0.585 -> 0.59
    assert _said(finding) == {"VLLM_METAL_MEMORY_FRACTION": 0.59}


def test_weights_that_leave_the_highest_budget_a_sliver_do_not_fit_and_get_no_gpus_or_offload() -> None:
    """At 0.95 of 20.00 GB the budget would leave 19.00 - 17.20 - 1.40 = 0.40 GB: a sliver. One Mac has no second
    device to split over, and its CPU memory is the same memory."""
    line = (
        f"{REFUSAL}metal_limit=20.00GB, fraction=0.9, usable_metal=18.00GB, model_memory=17.20GB, overhead=1.40GB, "
        "kv_budget=-0.60GB."
    )
    finding = _finding(line)
    assert finding.cause is Cause.DOES_NOT_FIT
    assert not {"--gpu-memory-utilization", "--tensor-parallel-size", "--cpu-offload-gb"} & set(_said(finding))
    assert any("4-bit" in step for step in finding.steps)
