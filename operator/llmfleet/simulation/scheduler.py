"""In-flight batching scheduler of the emulated engine (pure: no clock, no threads).

Each step carries one decode token for every sequence past its prompt, then prompt chunks
(chunked context) for sequences still in their context phase, in arrival order, within the
`maxNumTokens` budget. Waiting requests are admitted first-come-first-served while a batch slot
is free, the step has token budget left and the KV cache can hold the request at its full
length (prompt + max output tokens) on top of what every admitted sequence may still grow to.
That is TensorRT-LLM's `guaranteed_no_evict` policy: a request that does not fit waits in the
queue; nothing admitted is ever paused or evicted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

from llmfleet.simulation.kvcache import KvBlockAllocator, blocks_for_tokens
from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.timing import StepWork


class RequestNeverFits(ValueError):
    """The request needs more KV blocks than the whole cache has; waiting would never end."""


@dataclass(eq=False)
class Sequence:
    request_id: Hashable
    prompt_tokens: int
    max_output_tokens: int
    prompt_block_hashes: tuple[int, ...] = ()
    prefilled_tokens: int = 0  # includes the prefix reused from the cache
    reused_tokens: int = 0
    output_tokens: int = 0
    blocks: list[int] = field(default_factory=list)
    released: bool = False

    @property
    def in_context_phase(self) -> bool:
        return self.prefilled_tokens < self.prompt_tokens

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV the sequence holds: prompt processed so far plus its output."""
        return self.prefilled_tokens + self.output_tokens

    @property
    def finished(self) -> bool:
        return self.output_tokens >= self.max_output_tokens


@dataclass(frozen=True)
class StepPlan:
    prefill_chunks: tuple[tuple[Sequence, int], ...]
    decode_sequences: tuple[Sequence, ...]
    admitted: tuple[Sequence, ...]
    kv_tokens_read: int
    prompts_completed: int  # prompts whose last chunk is in this step

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens in self.prefill_chunks)

    @property
    def work(self) -> StepWork:
        return StepWork(prefill_tokens=self.prefill_tokens, prompts_completed=self.prompts_completed,
                        decode_sequences=len(self.decode_sequences), kv_tokens_read=self.kv_tokens_read)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_chunks and not self.decode_sequences


_NO_STEP = StepPlan((), (), (), 0, 0)


@dataclass(frozen=True)
class StepOutcome:
    # Sequences that produced one token in the step; `output_tokens` is that token's 1-based index.
    emitted: tuple[Sequence, ...]
    finished: tuple[Sequence, ...]


@dataclass(frozen=True)
class SchedulerStats:
    """What TensorRT-LLM reports per iteration, for the last planned step."""

    active_requests: int
    max_batch_size: int
    scheduled_requests: int
    context_requests: int
    waiting_requests: int
    generation_requests: int
    total_context_tokens: int
    kv_blocks_max: int
    kv_blocks_free: int
    kv_blocks_used: int
    kv_tokens_per_block: int
    kv_blocks_reused_total: int


class Scheduler:
    def __init__(self, profile: EngineProfile):
        self.profile = profile
        self.kv = KvBlockAllocator(profile.kv_blocks_total, profile.enable_prefix_reuse)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._last_plan = _NO_STEP

    def _blocks(self, tokens: int) -> int:
        return blocks_for_tokens(tokens, self.profile.kv_block_tokens)

    def _full_length_blocks(self, sequence: Sequence) -> int:
        return self._blocks(sequence.prompt_tokens + sequence.max_output_tokens)

    def submit(self, sequence: Sequence) -> None:
        needed = self._full_length_blocks(sequence)
        if needed > self.profile.kv_blocks_total:
            raise RequestNeverFits(
                f"request needs {needed} KV blocks ({sequence.prompt_tokens} prompt + "
                f"{sequence.max_output_tokens} output tokens), the cache has {self.profile.kv_blocks_total}")
        self.waiting.append(sequence)

    def cancel(self, sequence: Sequence) -> None:
        if sequence.released:
            return
        if sequence in self.waiting:
            self.waiting.remove(sequence)
        else:
            self.running.remove(sequence)
        self._release(sequence)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def plan_step(self) -> StepPlan:
        budget_tokens = self.profile.max_num_tokens
        block_tokens = self.profile.kv_block_tokens
        decode, kv_tokens_read = [], 0
        for sequence in self.running:  # the hot loop of a simulation: attributes, not properties
            context_tokens = sequence.prefilled_tokens + sequence.output_tokens
            if sequence.prefilled_tokens < sequence.prompt_tokens:
                continue  # in its context phase
            # The next token's KV needs a block only where it crosses the last block's end.
            if context_tokens + 1 > len(sequence.blocks) * block_tokens:
                self._grow(sequence, context_tokens + 1)
            kv_tokens_read += context_tokens
            decode.append(sequence)
        budget_tokens -= len(decode)

        chunks = []
        for sequence in self.running:
            if budget_tokens == 0:
                break
            if sequence.in_context_phase:
                chunk = self._prefill_chunk(sequence, budget_tokens)
                chunks.append((sequence, chunk))
                budget_tokens -= chunk

        admitted = []
        while budget_tokens > 0 and self.waiting and self._can_admit(self.waiting[0]):
            sequence = self.waiting.popleft()
            self._admit(sequence)
            admitted.append(sequence)
            chunk = self._prefill_chunk(sequence, budget_tokens)
            chunks.append((sequence, chunk))
            budget_tokens -= chunk

        prompts_completed = sum(sequence.prefilled_tokens + tokens == sequence.prompt_tokens
                                for sequence, tokens in chunks)
        self._last_plan = StepPlan(tuple(chunks), tuple(decode), tuple(admitted), kv_tokens_read, prompts_completed)
        return self._last_plan

    def complete_step(self, plan: StepPlan) -> StepOutcome:
        emitted = []
        for sequence, tokens in plan.prefill_chunks:
            if sequence.released:  # cancelled while the step ran
                continue
            sequence.prefilled_tokens += tokens
            self._publish_full_prompt_blocks(sequence)
            if not sequence.in_context_phase:
                sequence.output_tokens = 1  # the last context chunk yields the first token
                emitted.append(sequence)
        for sequence in plan.decode_sequences:
            if sequence.released:
                continue
            sequence.output_tokens += 1
            emitted.append(sequence)
        finished = tuple(sequence for sequence in emitted if sequence.finished)
        for sequence in finished:
            self.running.remove(sequence)
            self._release(sequence)
        return StepOutcome(tuple(emitted), finished)

    def stats(self) -> SchedulerStats:
        plan = self._last_plan if self.has_work else _NO_STEP
        return SchedulerStats(
            active_requests=len(self.running),
            max_batch_size=self.profile.max_batch_size,
            scheduled_requests=len(plan.prefill_chunks) + len(plan.decode_sequences),
            context_requests=len(plan.prefill_chunks),
            waiting_requests=len(self.waiting),
            generation_requests=len(plan.decode_sequences),
            total_context_tokens=plan.prefill_tokens,
            kv_blocks_max=self.kv.total_blocks,
            kv_blocks_free=self.kv.free_blocks,
            kv_blocks_used=self.kv.used_blocks,
            kv_tokens_per_block=self.profile.kv_block_tokens,
            kv_blocks_reused_total=self.kv.reused_blocks_total,
        )

    def _reusable_prefix_blocks(self, sequence: Sequence) -> tuple[int, ...]:
        # At least one prompt token is always computed: it yields the logits of the first token.
        limit = (sequence.prompt_tokens - 1) // self.profile.kv_block_tokens
        return sequence.prompt_block_hashes[:limit]

    def _can_admit(self, sequence: Sequence) -> bool:
        if len(self.running) >= self.profile.max_batch_size:
            return False
        match = self.kv.match_prefix(self._reusable_prefix_blocks(sequence))
        still_to_grow = sum(self._full_length_blocks(other) - len(other.blocks) for other in self.running)
        available = self.kv.free_blocks - match.evictable_blocks - still_to_grow
        return self._full_length_blocks(sequence) - match.blocks <= available

    def _admit(self, sequence: Sequence) -> None:
        reusable = self._reusable_prefix_blocks(sequence)
        matched = self.kv.match_prefix(reusable).blocks
        sequence.blocks = self.kv.acquire_prefix(reusable[:matched])
        sequence.reused_tokens = sequence.prefilled_tokens = matched * self.profile.kv_block_tokens
        self.running.append(sequence)

    def _prefill_chunk(self, sequence: Sequence, budget_tokens: int) -> int:
        chunk = min(sequence.prompt_tokens - sequence.prefilled_tokens, budget_tokens)
        completes_prompt = sequence.prefilled_tokens + chunk == sequence.prompt_tokens
        # Finishing the prompt also yields the first output token, whose KV is held from then on.
        self._grow(sequence, sequence.prefilled_tokens + chunk + completes_prompt)
        return chunk

    def _grow(self, sequence: Sequence, tokens: int) -> None:
        missing = self._blocks(tokens) - len(sequence.blocks)
        if missing > 0:
            sequence.blocks.extend(self.kv.allocate(missing))

    def _publish_full_prompt_blocks(self, sequence: Sequence) -> None:
        full_blocks = min(sequence.prefilled_tokens // self.profile.kv_block_tokens,
                          len(sequence.prompt_block_hashes))
        for index in range(full_blocks):
            self.kv.publish(sequence.blocks[index], sequence.prompt_block_hashes[index])

    def _release(self, sequence: Sequence) -> None:
        # Last blocks first: they are evicted first, and a prefix without its tail is still useful.
        self.kv.release(sequence.blocks[::-1])
        sequence.blocks = []
        sequence.released = True
