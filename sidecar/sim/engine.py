"""One simulated engine: vLLM V1-style continuous batching with chunked prefill over a paged KV pool. Pure.

Each step first serves the running requests in admission order (a decode takes one token, an unfinished prefill
takes what the token budget leaves); when a request needs a block and none is free, the most recently admitted
running request is preempted (recompute: its blocks are freed and it goes back to the front of the queue). Only
in a step without preemption are waiting requests admitted, first come first served, up to `max_num_seqs`.
A request with n > 1 runs as n sequences sharing its prompt, as vLLM V1 fans it out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.sim.config import SimConfig
from sidecar.sim.kv import BlockPool, extend_block_hashes
from sidecar.sim.records import (
    EngineGauges,
    FinishedRequest,
    FinishReason,
    Recorder,
    StepOutcome,
    StepRecord,
    TokenEvent,
)
from sidecar.sim.request import VOCAB_SIZE, RequestRejectedError, RequestState, SequenceState, check_request

__all__ = ["Engine", "RequestRejectedError", "ScheduledBatch", "check_request"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledBatch:
    """What one step will run; the GPU memory model sizes its activations from it before it executes."""

    work: tuple[tuple[SequenceState, int], ...]
    preemptions: int = 0
    scheduled_tokens: int = 0  # every token computed this step (prefill chunks and decodes)
    context_tokens: int = 0  # KV positions the scheduled sequences attend over
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    prefix_queries_blocks: int = 0
    prefix_hits_blocks: int = 0


class Engine:
    def __init__(self, *, config: SimConfig, index: int, recorder: Recorder, num_gpu_blocks: int | None = None) -> None:
        self._config = config
        self.index = index
        self._recorder = recorder
        self._pool = BlockPool(
            num_gpu_blocks=config.derived_num_gpu_blocks if num_gpu_blocks is None else num_gpu_blocks,
            version=config.vllm_version,
            enable_caching=config.enable_prefix_caching,
        )
        self._waiting: deque[SequenceState] = deque()
        self._running: list[SequenceState] = []
        self._requests: dict[str, RequestState] = {}
        self.admitting = True  # False: a wedged scheduler that never admits a waiting request again

    @property
    def pool(self) -> BlockPool:
        return self._pool

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    @property
    def load(self) -> int:
        """Sequences running or waiting, for routing."""
        return len(self._running) + len(self._waiting)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(
        self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int, now_s: float, n: int = 1
    ) -> None:
        """Queue a request, or raise RequestRejectedError with the message vLLM's server answers."""
        check_request(self._config, prompt_token_ids, max_tokens, n)
        if request_id in self._requests:
            raise ValueError(f"Request id {request_id} already running.")
        request = RequestState(
            request_id=request_id,
            prompt_tokens=len(prompt_token_ids),
            max_tokens=max_tokens,
            arrival_s=now_s,
            token_seed=hash(tuple(prompt_token_ids)) & 0xFFFFFFFF,
        )
        for index in range(n):
            request.sequences.append(SequenceState(request=request, index=index, tokens=list(prompt_token_ids)))
        self._requests[request_id] = request
        self._waiting.extend(request.sequences)

    def abort(self, request_id: str, now_s: float) -> bool:
        """Drop a request (the client went away); False when it is not here."""
        request = self._requests.get(request_id)
        if request is None:
            return False
        for seq in request.sequences:
            if seq.finished:
                continue
            if seq in self._running:
                self._running.remove(seq)
            elif seq in self._waiting:
                self._waiting.remove(seq)
            self._release(seq)
        self._finish_request(request, FinishReason.ABORT, now_s)
        return True

    def schedule(self) -> ScheduledBatch:
        """Choose this step's work, allocating (and preempting) blocks for it."""
        budget = self._config.max_num_batched_tokens
        work, preemptions, budget = self._schedule_running(budget)
        stats = [0, 0, 0, 0]
        if preemptions == 0 and self.admitting:  # as in vLLM V1: a step that had to preempt admits nobody
            self._admit_waiting(budget, work, stats)
        return ScheduledBatch(
            work=tuple(work),
            preemptions=preemptions,
            scheduled_tokens=sum(count for _, count in work),
            context_tokens=sum(seq.num_computed + count for seq, count in work),
            prefix_queries_tokens=stats[0],
            prefix_hits_tokens=stats[1],
            prefix_queries_blocks=stats[2],
            prefix_hits_blocks=stats[3],
        )

    def execute(self, batch: ScheduledBatch, now_s: float) -> StepOutcome:
        """Run the batch: advance every scheduled sequence, sample tokens, finish requests, record the step."""
        prefill_tokens = 0
        sampled = 0
        new_tokens: dict[str, int] = {}
        finished: list[RequestState] = []
        for seq, count in batch.work:
            decoding = seq.num_output > 0 and seq.num_computed == len(seq.tokens) - 1
            if not decoding:
                prefill_tokens += count
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s
            seq.num_computed += count
            if seq.num_computed < len(seq.tokens):
                continue  # a chunk of a longer prefill: nothing to sample yet
            seq.tokens.append(self._next_token(seq))
            seq.num_output += 1
            sampled += 1
            if seq.first_token_s is None:
                seq.first_token_s = now_s
            request = seq.request
            new_tokens[request.request_id] = new_tokens.get(request.request_id, 0) + 1
            if seq.num_output >= request.max_tokens:
                self._running.remove(seq)
                self._release(seq)
                if all(other.finished for other in request.sequences):
                    finished.append(request)
        if batch.work or batch.preemptions:
            self._recorder.step_done(
                StepRecord(
                    engine=self.index,
                    prompt_tokens_computed=prefill_tokens,
                    generation_tokens=sampled,
                    batched_tokens=prefill_tokens + sampled,
                    preemptions=batch.preemptions,
                    prefix_queries_tokens=batch.prefix_queries_tokens,
                    prefix_hits_tokens=batch.prefix_hits_tokens,
                    prefix_queries_blocks=batch.prefix_queries_blocks,
                    prefix_hits_blocks=batch.prefix_hits_blocks,
                )
            )
        for request in finished:
            self._finish_request(request, FinishReason.LENGTH, now_s)
        done = {request.request_id for request in finished}
        events = tuple(
            TokenEvent(
                request_id=request_id, new_tokens=count, finished=FinishReason.LENGTH if request_id in done else None
            )
            for request_id, count in new_tokens.items()
        )
        return StepOutcome(duration_s=self.duration_s(prefill_tokens), tokens=events)

    def step(self, now_s: float) -> StepOutcome:
        """schedule() then execute(), for an engine without a memory model in between."""
        return self.execute(self.schedule(), now_s)

    def duration_s(self, prefill_tokens: int) -> float:
        """One forward pass: a fixed decode cost plus the prefill tokens (an idle step costs a decode step)."""
        return self._config.decode_step_s + self._config.prefill_s_per_token * prefill_tokens

    def gauges(self) -> EngineGauges:
        return EngineGauges(
            engine=self.index,
            running=len(self._running),
            waiting=len(self._waiting),
            waiting_deferred=0,
            kv_usage_ratio=self._pool.usage_ratio(),
            num_gpu_blocks=self._pool.num_gpu_blocks,
            block_size=self._config.block_size,
            num_cpu_blocks=self._config.num_cpu_blocks,
        )

    def _schedule_running(self, budget: int) -> tuple[list[tuple[SequenceState, int]], int, int]:
        work: list[tuple[SequenceState, int]] = []
        preemptions = 0
        index = 0
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            count = min(len(seq.tokens) - seq.num_computed, budget)
            while not self._grow(seq, count):
                victim = self._running.pop()  # the most recently admitted has the lowest priority
                self._preempt(victim)
                preemptions += 1
                if victim is seq:
                    return work, preemptions, budget
            work.append((seq, count))
            budget -= count
            index += 1
        return work, preemptions, budget

    def _admit_waiting(self, budget: int, work: list[tuple[SequenceState, int]], stats: list[int]) -> None:
        block_size = self._config.block_size
        while self._waiting and len(self._running) < self._config.max_num_seqs and budget > 0:
            seq = self._waiting[0]
            hits: list[int] = []
            if self._config.enable_prefix_caching:
                # vLLM recomputes at least the last token, so a hit never covers the whole sequence.
                limit = len(seq.tokens) - 1
                extend_block_hashes(seq.hashes, seq.tokens, block_size, limit)
                hits = self._pool.lookup(seq.hashes[: limit // block_size])
            computed = len(hits) * block_size
            count = min(len(seq.tokens) - computed, budget)
            needed = -(-(computed + count) // block_size) - len(hits)
            if needed + self._pool.evictable_among(hits) > self._pool.num_free:
                return  # FCFS: nobody overtakes the head of the queue
            self._pool.share(hits)
            fresh = self._pool.allocate(needed)
            if fresh is None:  # pragma: no cover - ruled out by the check above
                raise AssertionError("block pool refused an allocation it had room for")
            seq.blocks = hits + fresh
            seq.num_computed = computed
            self._cache(seq, computed + count)
            if not seq.prefix_counted:  # counted once: a preempted request's recompute is not a new query
                seq.prefix_counted = True
                seq.cached_tokens = computed
                prompt = seq.request.prompt_tokens
                stats[0] += prompt
                stats[1] += computed
                stats[2] += prompt // block_size
                stats[3] += len(hits)
            self._waiting.popleft()
            self._running.append(seq)
            work.append((seq, count))
            budget -= count

    def _grow(self, seq: SequenceState, count: int) -> bool:
        """Give `seq` the blocks for `count` more tokens; False when the pool is out of free blocks."""
        needed = -(-(seq.num_computed + count) // self._config.block_size) - len(seq.blocks)
        if needed > 0:
            fresh = self._pool.allocate(needed)
            if fresh is None:
                return False
            seq.blocks.extend(fresh)
        self._cache(seq, seq.num_computed + count)
        return True

    def _cache(self, seq: SequenceState, num_tokens: int) -> None:
        """Publish the full blocks among the first `num_tokens` (vLLM caches them as soon as they are scheduled)."""
        if not self._config.enable_prefix_caching:
            return
        full = num_tokens // self._config.block_size
        if full > len(seq.hashes):
            extend_block_hashes(seq.hashes, seq.tokens, self._config.block_size, num_tokens)
        self._pool.cache(seq.blocks, seq.hashes, full)

    def _preempt(self, seq: SequenceState) -> None:
        self._pool.free(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_preemptions += 1
        self._waiting.appendleft(seq)

    def _release(self, seq: SequenceState) -> None:
        self._pool.free(seq.blocks)
        seq.blocks = []
        seq.finished = True

    def _next_token(self, seq: SequenceState) -> int:
        # Deterministic: equal prompts generate equal text, as greedy decoding would.
        return (seq.request.token_seed + 104_729 * seq.index + 7_919 * seq.num_output) % VOCAB_SIZE

    def _finish_request(self, request: RequestState, reason: FinishReason, now_s: float) -> None:
        del self._requests[request.request_id]
        scheduled = [seq.first_scheduled_s for seq in request.sequences if seq.first_scheduled_s is not None]
        first_tokens = [seq.first_token_s for seq in request.sequences if seq.first_token_s is not None]
        self._recorder.request_finished(
            FinishedRequest(
                engine=self.index,
                finish_reason=reason,
                prompt_tokens=request.prompt_tokens,
                generation_tokens=sum(seq.num_output for seq in request.sequences),
                max_tokens=request.max_tokens,
                n=len(request.sequences),
                arrival_s=request.arrival_s,
                first_scheduled_s=min(scheduled) if scheduled else None,
                first_token_s=min(first_tokens) if first_tokens else None,
                finished_s=now_s,
                num_preemptions=sum(seq.num_preemptions for seq in request.sequences),
                cached_prompt_tokens=request.sequences[0].cached_tokens,
            )
        )
