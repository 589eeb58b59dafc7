"""The scheduler: max_num_seqs, token budget, chunked prefill, FCFS, preemption, prefix accounting, rejections."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.sim.config import SimConfig, VllmVersion
from sidecar.sim.engine import Engine, RequestRejectedError
from sidecar.sim.records import FinishReason, StepOutcome
from tests.sim.driver import ListRecorder

BASE = SimConfig(block_size=4, num_gpu_blocks=64, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)


def engine_with(config: SimConfig = BASE) -> tuple[Engine, ListRecorder]:
    recorder = ListRecorder()
    return Engine(config=config, index=0, recorder=recorder), recorder


def run(engine: Engine, steps: int, start_s: float = 0.0) -> list[StepOutcome]:
    return [engine.step(start_s + 0.02 * i) for i in range(steps)]


def prompt(length: int, base: int = 0) -> list[int]:
    return [base + i for i in range(length)]


def test_running_never_exceeds_max_num_seqs() -> None:
    engine, _ = engine_with(replace(BASE, max_num_seqs=3))
    for i in range(5):
        engine.add_request(f"r{i}", prompt(4, 100 * i), 10, 0.0)
    engine.step(0.0)
    gauges = engine.gauges()
    assert (gauges.running, gauges.waiting) == (3, 2)


def test_chunked_prefill_within_the_token_budget() -> None:
    engine, recorder = engine_with()
    engine.add_request("long", prompt(100), 3, 0.0)
    first, second = run(engine, 2)
    assert [s.prompt_tokens_computed for s in recorder.steps] == [64, 36]
    assert [s.generation_tokens for s in recorder.steps] == [0, 1], "the first token comes with the last chunk"
    assert first.tokens == ()
    assert second.tokens[0].new_tokens == 1
    assert first.duration_s == pytest.approx(BASE.decode_step_s + BASE.prefill_s_per_token * 64)


def test_the_budget_is_shared_first_come_first_served() -> None:
    engine, recorder = engine_with()
    engine.add_request("a", prompt(50), 5, 0.0)
    engine.add_request("b", prompt(50, 1000), 5, 0.0)
    engine.step(0.0)
    assert recorder.steps[0].prompt_tokens_computed == 64  # 50 for a, a 14-token chunk of b
    engine.step(0.02)
    # a decodes one token, b finishes its prefill (36) and samples its first token.
    assert recorder.steps[1].prompt_tokens_computed == 36
    assert recorder.steps[1].generation_tokens == 2


def test_decodes_take_one_token_each_and_finish_at_max_tokens() -> None:
    engine, recorder = engine_with()
    engine.add_request("r", prompt(8), 5, 0.0)
    outcomes = run(engine, 5)
    assert recorder.steps[-1].batched_tokens == 1
    last = outcomes[-1].tokens[0]
    assert last.finished == FinishReason.LENGTH
    (done,) = recorder.finished
    assert (done.generation_tokens, done.finish_reason, done.prompt_tokens) == (5, FinishReason.LENGTH, 8)
    assert done.first_token_s == 0.0
    assert done.finished_s == pytest.approx(0.08)
    assert not engine.has_work
    assert engine.pool.num_used == 0


def test_a_decode_takes_a_new_block_when_it_crosses_a_boundary() -> None:
    engine, _ = engine_with()
    engine.add_request("r", prompt(8), 10, 0.0)
    engine.step(0.0)  # 8 prompt tokens: 2 blocks; first token sampled
    assert engine.pool.num_used == 2
    engine.step(0.02)  # computes token 9: a third block
    assert engine.pool.num_used == 3


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    config = replace(BASE, num_gpu_blocks=8, vllm_version=VllmVersion.V0_6)  # 8 blocks of 4 tokens, no null block
    engine, recorder = engine_with(config)
    engine.add_request("a", prompt(8, 100), 6, 0.0)  # 2 blocks
    engine.add_request("b", prompt(8, 200), 6, 0.0)  # 2 blocks
    engine.add_request("c", prompt(16, 300), 6, 0.0)  # 4 blocks: the pool is full
    engine.step(0.0)
    assert (engine.gauges().running, engine.pool.num_free) == (3, 0)
    engine.add_request("d", prompt(4, 400), 2, 0.01)  # needs a single block
    engine.step(0.02)  # a's 9th token needs a third block: c, admitted last, is preempted
    assert recorder.steps[-1].preemptions == 1
    assert engine.pool.num_free == 2
    assert (engine.gauges().running, engine.gauges().waiting) == (2, 2), "no admission in a step that preempted"
    engine.step(0.04)
    assert engine.gauges().running == 2, "d could fit, but c (17 tokens, 5 blocks) heads the queue"
    seen: dict[str, float] = {}
    for i in range(100):
        now = 0.06 + 0.02 * i
        for event in engine.step(now).tokens:
            seen.setdefault(event.request_id, now)
    assert seen["c"] <= seen["d"]
    preemptions = {r.prompt_tokens: r.num_preemptions for r in recorder.finished}
    assert preemptions == {8: 0, 16: 1, 4: 0}
    assert recorder.total("preemptions") == 1
    c = next(r for r in recorder.finished if r.prompt_tokens == 16)
    assert c.generation_tokens == 6, "a recomputed request keeps the tokens it had generated"


def test_prefix_hits_count_whole_cached_blocks_once() -> None:
    engine, recorder = engine_with()
    shared = prompt(10, 7000)  # two full blocks of 4 and a partial one
    engine.add_request("first", [*shared, 1, 2], 3, 0.0)
    engine.step(0.0)
    engine.add_request("second", [*shared, 3, 4, 5], 3, 0.02)
    engine.step(0.02)
    queries = recorder.total("prefix_queries_tokens")
    hits = recorder.total("prefix_hits_tokens")
    assert (queries, hits) == (12 + 13, 8), "the partial third block is never shared"
    assert recorder.total("prefix_hits_blocks") == 2
    assert recorder.total("prefix_queries_blocks") == 3 + 3
    assert recorder.steps[1].prompt_tokens_computed == 5, "cached tokens are not recomputed"
    run(engine, 5, 0.04)
    second = next(r for r in recorder.finished if r.prompt_tokens == 13)
    assert second.cached_prompt_tokens == 8


def test_requests_admitted_in_the_same_step_share_their_prefix() -> None:
    engine, recorder = engine_with()
    shared = prompt(16, 3000)
    engine.add_request("a", [*shared, 1], 2, 0.0)
    engine.add_request("b", [*shared, 2], 2, 0.0)
    engine.step(0.0)
    assert recorder.steps[0].prefix_hits_tokens == 16
    assert engine.pool.num_used == 5 + 1


def test_a_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    engine, recorder = engine_with()
    engine.add_request("a", prompt(8), 1, 0.0)
    engine.step(0.0)
    engine.add_request("b", prompt(8), 1, 0.02)
    engine.step(0.02)
    assert recorder.steps[1].prefix_hits_tokens == 4
    assert recorder.steps[1].prompt_tokens_computed == 4


def test_no_hits_without_prefix_caching() -> None:
    engine, recorder = engine_with(replace(BASE, enable_prefix_caching=False))
    for name in ("a", "b"):
        engine.add_request(name, prompt(16), 2, 0.0)
        engine.step(0.0)
    assert recorder.total("prefix_hits_tokens") == 0


def test_rejection_carries_vllms_message() -> None:
    engine, _ = engine_with(replace(BASE, max_model_len=4096))
    with pytest.raises(RequestRejectedError) as caught:
        engine.add_request("r", prompt(4000), 200, 0.0)
    assert caught.value.message == (
        "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens "
        "(4000 in the messages, 200 in the completion). Please reduce the length of the messages or completion."
    )
    with pytest.raises(RequestRejectedError, match="cannot be empty"):
        engine.add_request("r", [], 1, 0.0)
    with pytest.raises(RequestRejectedError, match="max_tokens must be at least 1"):
        engine.add_request("r", [1], 0, 0.0)
    engine.add_request("r", [1], 1, 0.0)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("r", [1], 1, 0.0)


def test_abort_frees_blocks_and_records_the_request() -> None:
    engine, recorder = engine_with(replace(BASE, max_num_seqs=1))
    engine.add_request("running", prompt(8), 50, 0.0)
    engine.add_request("waiting", prompt(8, 100), 50, 0.0)
    run(engine, 3)
    assert engine.abort("waiting", 1.0)
    assert engine.abort("running", 1.0)
    assert not engine.abort("unknown", 1.0)
    assert engine.pool.num_used == 0
    assert not engine.has_work
    reasons = {(r.finish_reason, r.first_scheduled_s is None, r.generation_tokens) for r in recorder.finished}
    assert reasons == {(FinishReason.ABORT, True, 0), (FinishReason.ABORT, False, 3)}


def test_n_fans_out_into_sequences_sharing_the_prompt() -> None:
    engine, recorder = engine_with()
    engine.add_request("r", prompt(8), 3, 0.0, n=2)
    outcomes = run(engine, 3)
    assert [o.tokens[0].new_tokens for o in outcomes] == [2, 2, 2]
    assert engine.gauges().running == 0
    (done,) = recorder.finished
    assert (done.n, done.generation_tokens) == (2, 6)
    assert recorder.steps[0].prefix_hits_tokens == 4, "the second sequence reuses the first's full blocks"


def test_generated_tokens_add_up() -> None:
    engine, recorder = engine_with()
    for i in range(6):
        engine.add_request(f"r{i}", prompt(30 + i, 1000 * i), 7 + i, 0.0)
    streamed = 0
    for i in range(100):
        streamed += sum(event.new_tokens for event in engine.step(0.02 * i).tokens)
    assert streamed == recorder.total("generation_tokens") == sum(r.generation_tokens for r in recorder.finished)
    assert recorder.total("batched_tokens") == recorder.total("prompt_tokens_computed") + streamed


def test_gauges_report_the_versions_cpu_blocks() -> None:
    v0, _ = engine_with(replace(BASE, vllm_version=VllmVersion.V0_6))
    v1, _ = engine_with(replace(BASE, vllm_version=VllmVersion.V0_32))
    assert v0.gauges().num_cpu_blocks == BASE.swap_space_bytes // BASE.block_bytes
    assert v1.gauges().num_cpu_blocks is None
    assert v1.gauges().num_gpu_blocks == 64
    assert v1.gauges().block_size == 4
