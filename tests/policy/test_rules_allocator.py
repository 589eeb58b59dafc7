"""The allocator rule: PyTorch's allocator retrying allocations inside vLLM (the allocator probe) pauses admission
with the numbers, and the pause ends once the short horizon holds no retry; from probe samples through the
Deriver to the policy, on virtual time."""

from __future__ import annotations

import dataclasses
import json

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.allocator import AllocatorReading
from sidecar.model.derived import AllocatorDerived, Derived
from sidecar.model.source import SourceResult
from sidecar.parse.probe_file import parse_probe_file
from sidecar.policy import Observation, PauseRule
from sidecar.policy.rules import pause_findings
from tests.policy.builders import WALL0, Replay, no_probe
from tests.probe.documents import device, document
from tests.unit import builders as raw

PAUSE = "pause_admission"
RESUME = "resume_admission"


def _run(retries_at: list[int], ooms_at: list[int] | None = None, pause_alloc_retries: int = 1) -> Replay:
    deriver, window = Deriver(DeriveSettings()), Window(span_s=600)
    replay = Replay(dataclasses.replace(no_probe(), pause_alloc_retries=pause_alloc_retries))
    ooms = ooms_at or [0] * len(retries_at)
    for i, (retries, failed) in enumerate(zip(retries_at, ooms, strict=True)):
        t = 2.0 * i
        sample = document(
            77, time_unix_s=WALL0 + t, rank=0, devices=[device(0, num_alloc_retries=retries, num_ooms=failed)]
        )
        reading = AllocatorReading(processes=(parse_probe_file(json.dumps(sample).encode()),))
        base = raw.snapshot(t, (raw.engine(generation_tokens_total=100.0 * i, kv_cache_usage_ratio=0.5),))
        window.push(dataclasses.replace(base, allocator=SourceResult(source="probe", duration_s=0.0, value=reading)))
        observation = Observation(
            now_s=t,
            wall_time_s=WALL0 + t,
            poll_ok=True,
            vllm_healthy=True,
            data_age_s=0.0,
            derived=deriver.derive(window),
        )
        replay.step(observation)
    return replay


def _rows(replay: Replay) -> list[tuple[float, str]]:
    return [(d.now_s, a.kind.value) for d in replay.decisions for a in d.actions]


def test_retries_pause_with_the_numbers_and_resume_once_the_horizon_holds_none() -> None:
    retries = [0] * 10 + [2, 3, 3, 3] + [3] * 16  # two retries at 20 s, one more at 22 s
    replay = _run(retries)
    # Paused at 20 s: the sample 5 polls back (10 s) read 0. At 32 s the horizon starts at 22 s (3): none left,
    # and the 10 s dwell has passed.
    assert _rows(replay) == [(20.0, PAUSE), (32.0, RESUME)]
    assert replay.at(20).pause_reason == (
        "PyTorch's allocator retried 2 allocations in the last polls on GPU 0 rank 0, "
        "25 % of its reserved memory in split free pieces"
    )
    assert replay.at(20).actions[0].cause is PauseRule.ALLOCATOR_RETRIES


def test_an_allocation_that_failed_pauses_even_under_the_retry_threshold() -> None:
    replay = _run([0] * 8 + [1] * 4, ooms_at=[0] * 8 + [1] * 4, pause_alloc_retries=5)
    assert _rows(replay) == [(16.0, PAUSE)]
    assert "1 out of memory" in (replay.at(16).pause_reason or "")


def test_zero_turns_the_rule_off_and_a_quiet_allocator_never_pauses() -> None:
    assert _rows(_run([0] * 6 + [9] * 6, pause_alloc_retries=0)) == []
    assert _rows(_run([4] * 12)) == []  # retries from before the horizon (vLLM's start): not rising


def test_no_probe_no_finding() -> None:
    derived = Deriver(DeriveSettings()).derive(_window_without_probe())
    assert pause_findings(derived, no_probe(), {}) == []


def _window_without_probe() -> Window:
    window = Window(span_s=600)
    window.push(raw.snapshot(0.0, (raw.engine(),)))
    return window


def test_the_text_without_a_rank_or_a_ratio() -> None:
    allocator = AllocatorDerived(
        gpu=3,
        rank="none",
        processes=1,
        allocated_bytes=0,
        reserved_bytes=0,
        inactive_split_bytes=0,
        fragmentation_ratio=None,
        alloc_retries_total=5,
        ooms_total=0,
        alloc_retries_recent=5,
        ooms_recent=0,
    )
    (found,) = pause_findings(Derived(engines=(), gpus=(), problems=(), allocators=(allocator,)), no_probe(), {})
    assert found.text == "PyTorch's allocator retried 5 allocations in the last polls on GPU 3"
