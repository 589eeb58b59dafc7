"""The remediation rules (--remediate): which change the doctor's reading of a crash allows, the guard rails, and
how a change settles. Pure: causes are built by hand as `cause_reading.explain` returns them."""

from __future__ import annotations

import pytest

from sidecar.model.cause import CrashCause, FlagChange
from sidecar.model.remediation import Step, StepState
from sidecar.policy import Policy, PolicyState, ProcedureEvent, RestartLedger, RestartReason
from sidecar.policy.remediation import (
    DAY_S,
    Refusal,
    Watch,
    flags_in_effect,
    judge,
    judge_crash,
    parse_allowances,
    propose,
    settle,
)
from tests.policy.builders import WALL0, engine, no_probe, obs

ALLOWED = parse_allowances("max-model-len=512..4096,gpu-memory-utilization=0.8..0.95")


def refusal_cause(*, fits: int = 992, today: int | None = 2048, cause: str = "kv_cache_blowout") -> CrashCause:
    """vLLM 0.32 on CPU refusing max_model_len 2048 with a 1,024-token KV cache, as the doctor reads it."""
    return CrashCause(
        cause=cause,
        severity="critical",
        summary="vLLM could not start: max_model_len 2,048 is more than its KV cache holds",
        evidence=("vLLM refused to start: ...",),
        recommendations=(
            FlagChange(
                flag="--max-model-len",
                value=fits,
                why="fits 1,000 tokens",
                pasted=f"--max-model-len {fits}",
                current=today,
            ),
            FlagChange(
                flag="--kv-cache-memory-bytes",
                value=2097152,
                why="room for 2,048",
                pasted="--kv-cache-memory-bytes 2097152",
            ),
        ),
        source="file refused.log",
        read_wall_time_s=WALL0,
        crashed=True,
        ran_with=(("--max-model-len", float(today)),) if today is not None else (),
    )


def step(flag: str = "--max-model-len", before: float = 2048, after: float = 992, **kw: object) -> Step:
    fields: dict[str, object] = {
        "file_before": None,
        "cause": "kv_cache_blowout",
        "why": "",
        "wall_time_s": WALL0,
        "state": StepState.CONFIRMED,
    }
    fields.update(kw)
    return Step(flag=flag, before=before, after=after, **fields)  # type: ignore[arg-type]


def test_allowances_are_read_with_their_ranges_and_bad_ones_named() -> None:
    assert [a.words() for a in ALLOWED] == ["--max-model-len 512..4096", "--gpu-memory-utilization 0.8..0.95"]
    for text, said in (
        ("tensor-parallel-size=1..8", "'tensor-parallel-size' is not a flag the sidecar may change"),
        ("max-num-seqs", "gives no range: write max-num-seqs=LOW..HIGH"),
        ("max-num-seqs=a..b", "LOW and HIGH must be numbers"),
        ("max-num-seqs=64..8", "the range must be 0 < LOW <= HIGH"),
        ("gpu-memory-utilization=0.8..1.2", "at most 1"),
        ("max-num-seqs=1..8,--max-num-seqs=2..4", "max-num-seqs is given twice"),
    ):
        with pytest.raises(ValueError) as raised:  # noqa: PT011 - the words are checked below
            parse_allowances(text)
        assert said in str(raised.value), text


def test_a_refused_start_gets_the_doctors_max_model_len_from_the_value_it_ran_with() -> None:
    proposal = propose(refusal_cause(), allowances=ALLOWED, steps=[], now_wall_s=WALL0, max_per_day=3)
    assert isinstance(proposal, Step)
    assert proposal.diff() == "--max-model-len 2048 -> 992"
    assert (proposal.state, proposal.file_before, proposal.cause) == (StepState.PENDING, None, "kv_cache_blowout")
    assert flags_in_effect([proposal]) == {"--max-model-len": 992.0}


def test_nothing_to_do_for_an_unknown_cause_or_one_only_a_person_can_fix() -> None:
    unknown = CrashCause.unknown("vLLM's log is empty", source="file x", wall_time_s=WALL0)
    assert propose(unknown, allowances=ALLOWED, steps=[], now_wall_s=WALL0, max_per_day=3) is None
    parallel = CrashCause(
        cause="does_not_fit",
        severity="critical",
        summary="the model does not fit",
        evidence=(),
        recommendations=(
            FlagChange(flag="--tensor-parallel-size", value=2, why="", pasted="--tensor-parallel-size 2"),
        ),
        source="",
        read_wall_time_s=WALL0,
    )
    assert propose(parallel, allowances=ALLOWED, steps=[], now_wall_s=WALL0, max_per_day=3) is None


@pytest.mark.parametrize(
    ("cause", "allowed", "steps", "said"),
    [
        (refusal_cause(), "max-num-seqs=8..64", [], "is not among the flags --remediate allows"),
        (refusal_cause(today=None), "max-model-len=512..4096", [], "does not say today's --max-model-len"),
        (refusal_cause(fits=256), "max-model-len=512..4096", [], "outside the range --remediate allows"),
        (
            refusal_cause(),
            "max-model-len=512..4096",
            [step(flag="--gpu-memory-utilization", before=0.9, after=0.95, state=StepState.PENDING)],
            "one change at a time",
        ),
        (
            refusal_cause(),
            "max-model-len=512..4096",
            [step(after=1024, state=StepState.REVERTED, held=True)],
            "held since a change to it was reverted",
        ),
        (
            refusal_cause(),
            "max-model-len=512..4096",
            [step(before=1024, after=2048)],
            "would undo an earlier step (--max-model-len 1024 -> 2048)",
        ),
        (
            refusal_cause(),
            "max-model-len=512..4096",
            [
                step(flag="--gpu-memory-utilization", before=0.9, after=0.95, wall_time_s=WALL0 - 3600 * i)
                for i in range(3)
            ],
            "the daily budget is spent: 3 changes in the last 24 h",
        ),
    ],
)
def test_the_guard_rails_refuse_with_a_reason(cause: CrashCause, allowed: str, steps: list[Step], said: str) -> None:
    proposal = propose(cause, allowances=parse_allowances(allowed), steps=steps, now_wall_s=WALL0, max_per_day=3)
    assert isinstance(proposal, Refusal)
    assert proposal.flag == "--max-model-len"
    assert said in proposal.why


def test_the_budget_is_for_any_24_hours_and_the_same_direction_may_go_on() -> None:
    old = [step(before=4096, after=2048, wall_time_s=WALL0 - DAY_S - 1) for _ in range(3)]
    proposal = propose(refusal_cause(), allowances=ALLOWED, steps=old, now_wall_s=WALL0, max_per_day=3)
    assert isinstance(proposal, Step)
    assert proposal.file_before == 2048.0  # the file held the earlier step's value: a revert restores it


def test_the_flags_file_is_replayed_from_the_steps() -> None:
    first = step(before=4096, after=2048)
    second = step(before=2048, after=992, file_before=2048.0, state=StepState.REVERTED)
    budget = step(flag="--gpu-memory-utilization", before=0.9, after=0.95)
    assert flags_in_effect([first, budget]) == {"--max-model-len": 2048.0, "--gpu-memory-utilization": 0.95}
    assert flags_in_effect([first, second, budget]) == {"--max-model-len": 2048.0, "--gpu-memory-utilization": 0.95}
    assert flags_in_effect([step(state=StepState.REVERTED)]) == {}


def test_a_change_is_confirmed_after_the_window_or_reverted_at_the_start_timeout() -> None:
    change = step(state=StepState.PENDING)
    timing = {"start_timeout_s": 900.0, "window_s": 600.0}
    assert judge(change, Watch(set_s=0, healthy_since_s=None), now_s=899, **timing) is None
    reverted = judge(change, Watch(set_s=0, healthy_since_s=None), now_s=900, **timing)
    assert reverted is not None
    assert reverted.startswith("reverted: vLLM not healthy within 900 seconds of --max-model-len 2048 -> 992")
    assert judge(change, Watch(set_s=0, healthy_since_s=40), now_s=639, **timing) is None
    confirmed = judge(change, Watch(set_s=0, healthy_since_s=40), now_s=640, **timing)
    assert confirmed == "confirmed: vLLM healthy for 600 seconds with --max-model-len 2048 -> 992"
    settled = settle(change, confirmed, WALL0 + 640)
    assert (settled.state, settled.held, settled.resolved_wall_time_s) == (StepState.CONFIRMED, False, WALL0 + 640)
    assert settle(change, reverted, WALL0).held


def test_a_crash_reverts_a_change_only_when_it_ran_with_it_and_for_the_same_cause() -> None:
    change = step(state=StepState.PENDING)
    assert judge_crash(change, refusal_cause(today=2048)) is None  # the start from before: still the newest
    back = judge_crash(change, refusal_cause(today=992))
    assert back == "reverted: kv_cache_blowout is back with --max-model-len 992: a person must decide"
    assert judge_crash(change, refusal_cause(today=992, cause="configuration_overshoot")) is None


def test_a_restart_for_changed_flags_skips_the_drain_and_supersedes_a_failed_start() -> None:
    policy, ledger = Policy(no_probe()), RestartLedger()
    down = obs(0, healthy=False, poll_ok=False, age_s=None)
    policy.decide(down, ledger)
    first = policy.restart_for_flags("--max-model-len 2048 -> 992", 1, WALL0 + 1, ledger)
    assert [a.kind.value for a in first.actions] == ["pause_admission", "drain", "restart"]
    assert "vLLM not serving, nothing to drain" in first.actions[-1].reason
    assert first.restart_reason is RestartReason.FLAGS_CHANGED
    busy = policy.restart_for_flags("again", 2, WALL0 + 2, ledger)
    assert busy.actions == ()
    assert "refused: a restart is in progress (awaiting_adapter)" in busy.reason
    _, ledger = policy.procedure_event(ProcedureEvent.RESTART_ACCEPTED, 3, WALL0 + 3, ledger)
    again = policy.restart_for_flags("--max-model-len 992 -> 2048 (reverted)", 40, WALL0 + 40, ledger)
    assert [a.kind.value for a in again.actions] == ["drain", "restart"]  # the start it waited for failed
    _, ledger = policy.procedure_event(ProcedureEvent.RESTART_ACCEPTED, 41, WALL0 + 41, ledger)
    back = policy.decide(obs(60, engine(running=0)), ledger)
    assert back.state is not PolicyState.RESTARTING
    assert [record.reason for record in ledger.records] == [RestartReason.FLAGS_CHANGED] * 2
