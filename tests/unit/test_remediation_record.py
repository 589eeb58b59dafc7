"""The remediation record's trimming: bounded by a count and, for a Deployment's annotation, by bytes, without
ever changing what vLLM's next start gets or ending a hold unseen."""

from __future__ import annotations

import json
from dataclasses import replace

from sidecar.actuators.kube_flags import RECORD_MAX_BYTES
from sidecar.actuators.remediation_record import document_of, trimmed
from sidecar.model.remediation import Step, StepState
from sidecar.policy.remediation import flags_in_effect

# The doctor's arithmetic as a step keeps it: a few hundred bytes, as real ones are.
WHY = (
    "the budget holds the weights and activations but leaves no KV cache: one step of 5% of the card above "
    "vLLM's default 0.9 = 0.95, rounded up -> 0.95; today's value is not in the log: below 0.9, 0.9 first"
)


def step(flag: str, before: float, after: float, state: StepState = StepState.CONFIRMED, **kw: object) -> Step:
    fields: dict[str, object] = {
        "file_before": None,
        "cause": "kv_cache_blowout",
        "why": WHY,
        "wall_time_s": 1_790_000_000.0,
        "state": state,
        "outcome": "healthy through the window",
    }
    fields.update(kw)
    return Step(flag=flag, before=before, after=after, **fields)  # type: ignore[arg-type]


def history(count: int) -> list[Step]:
    """`count` settled steps on --max-num-seqs, each from the value the one before set."""
    steps: list[Step] = []
    value = 256.0
    for index in range(count):
        state = StepState.REVERTED if index % 3 == 2 else StepState.CONFIRMED
        steps.append(step("--max-num-seqs", value, value - 1, state, file_before=value if index else None))
        value -= 1
    return steps


def size(steps: list[Step]) -> int:
    return len(json.dumps(document_of(steps), separators=(",", ":")).encode())


def test_the_oldest_settled_steps_go_first_and_the_flags_in_effect_stay() -> None:
    steps = history(12)
    kept = trimmed(steps, keep=5)
    assert len(kept) == 5
    assert kept == steps[-5:]
    assert flags_in_effect(kept) == flags_in_effect(steps)


def test_a_flag_set_only_by_its_oldest_step_keeps_that_step() -> None:
    # --max-model-len was set once, long ago, and confirmed: dropping that step would take the flag out of
    # vLLM's next start, the failure it fixed back with it.
    oldest = step("--max-model-len", 2048, 992)
    steps = [oldest, *history(10)]
    kept = trimmed(steps, keep=4)
    assert oldest in kept
    assert flags_in_effect(kept) == flags_in_effect(steps)
    assert len(kept) == 4


def test_a_pending_step_and_a_held_one_are_never_dropped() -> None:
    held = step("--gpu-memory-utilization", 0.9, 0.85, StepState.REVERTED, held=True)
    pending = step("--max-num-seqs", 200, 100, StepState.PENDING)
    steps = [held, *history(6), pending]
    kept = trimmed(steps, keep=1)
    assert held in kept
    assert pending in kept
    assert flags_in_effect(kept) == flags_in_effect(steps)


def test_the_deployment_annotation_keeps_to_its_bytes() -> None:
    steps = history(200)
    assert size(steps) > 2 * RECORD_MAX_BYTES  # 200 steps: 86 KiB of the 256 KiB all annotations share
    kept = trimmed(steps, max_bytes=RECORD_MAX_BYTES)
    assert size(kept) <= RECORD_MAX_BYTES
    assert len(kept) >= 40
    assert kept == steps[-len(kept) :]
    assert flags_in_effect(kept) == flags_in_effect(steps)


def test_what_must_stay_stays_over_the_bytes() -> None:
    held = [step(f"--flag-{n}", 1, 2, StepState.REVERTED, held=True, why=WHY * 20) for n in range(12)]
    assert size(held) > RECORD_MAX_BYTES
    assert trimmed(held, max_bytes=RECORD_MAX_BYTES) == held


def test_under_both_bounds_nothing_changes() -> None:
    steps = [replace(s, why="w") for s in history(5)]
    assert trimmed(steps, keep=200, max_bytes=RECORD_MAX_BYTES) == steps
