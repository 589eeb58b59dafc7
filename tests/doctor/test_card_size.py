"""A refused start whose log states the weights and a negative KV budget but not the card: the smallest common
card those numbers allow decides whether a larger budget can give the KV cache room. Lines as vLLM 0.10's V1
engine prints them (gpu_model_runner.py 'Model loading took', gpu_worker.py 'Available KV cache memory',
kv_cache_utils.py's ValueError); the amounts are made up."""

from __future__ import annotations

import pytest

from sidecar.doctor.card_size import likely_card
from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.formula import GIB
from sidecar.doctor.ledger_entries import build_ledger
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.setup import resolve
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
PREFIX = "(EngineCore_DP0 pid=7) INFO 10-01 12:00:00 [gpu_worker.py:298] "


def _log(weights_gib: float, kv_gib: float, utilization: float | None = None) -> str:
    args = "{'model': 'some/model-7b', 'max_model_len': 4096"
    args += f", 'gpu_memory_utilization': {utilization}}}" if utilization is not None else "}"
    return "\n".join(
        [
            f"(APIServer pid=5) INFO 10-01 11:59:00 [utils.py:328] non-default args: {args}",
            f"{PREFIX}Model loading took {weights_gib} GiB and 20.1 seconds",
            f"{PREFIX}Available KV cache memory: {kv_gib} GiB",
            "(EngineCore_DP0 pid=7) ERROR 10-01 12:00:01 [core.py:718] ValueError: No available memory for the cache "
            "blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
        ]
    )


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def _flags(finding: Finding) -> set[str]:
    return {r.flag for r in finding.recommendations}


def test_a_7b_model_in_16_bits_that_misses_by_a_little_is_on_a_16_gb_card() -> None:
    facts = parse_log(_log(13.13, -0.17))
    card = likely_card(build_ledger(facts, resolve(evidence(live_evidence=DOWN, log_facts=facts))), 0.95)
    assert card is not None
    # the budget held at least 13.13 - 0.17 + 0.5 = 13.46 GiB at 0.9: a card of 14.96 GiB or more; 16 GB is next
    assert card.total_bytes == pytest.approx(15.99 * GIB)
    assert card.kv_at_bytes == pytest.approx((0.95 - 0.9) * 15.99 * GIB - 0.17 * GIB)
    assert "assumed" in card.why


@pytest.mark.parametrize(
    ("weights", "kv", "utilization"),
    [
        (14.08, -1.81, 0.85),  # 0.95 on a 16 GB card leaves 1.60 - 1.81 < 0
        (13.14, -1.66, 0.83),  # 0.95 leaves 0.26 GiB
        (7.61, -0.23, None),  # vLLM's default 0.9; a 10 GB card, 0.95 leaves 0.26 GiB
    ],
)
def test_weights_that_leave_the_likely_card_no_kv_cache_do_not_fit_and_the_budget_is_not_raised(
    weights: float, kv: float, utilization: float | None
) -> None:
    finding = _finding(_log(weights, kv, utilization))
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in _flags(finding)
    assert "--cpu-offload-gb" in _flags(finding)
    # the log names neither the card nor how many there are: more GPUs is a step, not a recommendation
    assert "--tensor-parallel-size" not in _flags(finding)
    assert "--tensor-parallel-size 2" in finding.steps[0]


@pytest.mark.parametrize(
    ("weights", "kv", "utilization"),
    [
        (14.25, -0.70, 0.6),  # a 24 GB card: 0.95 leaves 7.6 GiB
        (21.88, -0.12, 0.8),  # a 32 GB card: 0.95 leaves 4.6 GiB
        (2.16, -0.72, 0.25),  # an 8 GB card: 0.95 leaves 4.7 GiB
    ],
)
def test_weights_that_leave_the_likely_card_room_get_a_larger_budget(
    weights: float, kv: float, utilization: float
) -> None:
    finding = _finding(_log(weights, kv, utilization))
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--gpu-memory-utilization" in _flags(finding)
    assert "smallest common card" in "\n".join(finding.evidence)


def test_a_shortfall_larger_than_a_third_of_the_weights_says_nothing_of_the_card() -> None:
    # activations, graphs or another process ate the budget: 15.67 GiB of weights, 14.28 GiB short
    facts = parse_log(_log(15.67, -14.28, 0.9))
    assert likely_card(build_ledger(facts, resolve(evidence(live_evidence=DOWN, log_facts=facts))), 0.95) is None


@pytest.mark.parametrize("utilization", [0.0, 0.95, 1.5])
def test_a_budget_of_nothing_or_past_the_highest_reads_no_card(utilization: float) -> None:
    # found by test_robustness (CI run 21): a budget of 0 divided the budget's floor by zero
    facts = parse_log(_log(13.13, -0.17, utilization))
    ledger = build_ledger(facts, resolve(evidence(live_evidence=DOWN, log_facts=facts)))
    assert ledger.utilization == utilization
    assert likely_card(ledger, 0.95) is None
