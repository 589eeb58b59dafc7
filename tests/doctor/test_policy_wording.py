"""The doctor reads the daemon's pause and hang reasons from /status as text (the numbers are in the text): these
tests run the policy's own rules and check that the doctor's patterns still read what they write, so a reworded
reason fails here instead of silently emptying the doctor's history findings."""

from __future__ import annotations

import dataclasses

from sidecar.doctor.hang import _about_hang
from sidecar.doctor.paused_concurrency import _KV_PAUSE, _PREEMPTION_PAUSE, _WAITING_PAUSE
from sidecar.model.derived import Derived
from sidecar.policy import PauseRule, PolicySettings
from sidecar.policy.rules import hung_cause, next_waiting_streaks, pause_findings
from tests.policy.builders import engine

S = PolicySettings()


def _derived(*engines: object) -> Derived:
    return Derived(engines=engines, gpus=(), problems=())  # type: ignore[arg-type]


def _text(derived: Derived, rule: PauseRule, streaks: dict[str, int] | None = None) -> str:
    (found,) = [f for f in pause_findings(derived, S, streaks or {}) if f.rule is rule]
    return found.text


def test_the_kv_pause_reason_is_read_with_its_numbers() -> None:
    match = _KV_PAUSE.search(_text(_derived(engine(usage=0.95)), PauseRule.KV_CACHE_USAGE))
    assert match is not None
    assert (match.group("usage"), match.group("limit"), match.group("engine")) == ("0.95", "0.90", "engine 0")


def test_the_preemption_pause_reason_is_read_with_its_numbers() -> None:
    storm = dataclasses.replace(engine(usage=0.5), preemptions_per_second=2.5)
    match = _PREEMPTION_PAUSE.search(_text(_derived(storm), PauseRule.PREEMPTIONS))
    assert match is not None
    assert (match.group("rate"), match.group("limit")) == ("2.50", "1.00")


def test_the_queue_pause_reason_is_read_with_its_numbers() -> None:
    queued = _derived(engine(running=4.0, waiting=12.0))
    streaks: dict[str, int] = {}
    for _ in range(S.waiting_ticks):
        streaks = next_waiting_streaks(streaks, queued, S)
    match = _WAITING_PAUSE.search(_text(queued, PauseRule.WAITING_QUEUE, streaks))
    assert match is not None
    assert (match.group("waiting"), match.group("running")) == ("12", "4")


def test_the_stall_and_hang_reasons_are_read_as_a_hang() -> None:
    stalled = _derived(engine(running=3.0, stalled_s=150.0))
    assert _about_hang(_text(stalled, PauseRule.ENGINE_STALLED))
    cause = hung_cause(stalled, S)
    assert cause is not None
    assert _about_hang(cause.text)
