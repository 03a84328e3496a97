"""The emulated engine run in virtual time: the same scheduler and step costs as the served
emulator (scheduler.py, timing.py), without threads, Triton or a wall clock, so an hour of
traffic takes seconds. What the planner's queueing model is checked against.

A request that arrives while a step runs joins at the next step, as in the served engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmfleet_sandbox.emulator.profile import EngineProfile
from llmfleet_sandbox.emulator.scheduler import Scheduler, Sequence
from llmfleet_sandbox.emulator.timing import StepWork, jitter_multiplier, step_duration_ms


@dataclass(frozen=True)
class Arrival:
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Served:
    arrival: Arrival
    first_token_ms: float
    finished_ms: float

    @property
    def ttft_ms(self) -> float:
        return self.first_token_ms - self.arrival.arrival_ms

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first; None for a one-token answer."""
        if self.arrival.output_tokens < 2:
            return None
        return (self.finished_ms - self.first_token_ms) / (self.arrival.output_tokens - 1)


def serve(profile: EngineProfile, arrivals: Iterable[Arrival], seed: int = 0,
          step_ms: Callable[[StepWork], float] | None = None) -> list[Served]:
    """Every arrival served to its last token, in arrival order. `step_ms`: what a step's work
    costs, the profile's linear cost (the served emulator's) unless another model is given."""
    if step_ms is None:
        def step_ms(work: StepWork) -> float:
            return step_duration_ms(profile, work)
    pending = sorted(arrivals, key=lambda arrival: arrival.arrival_ms)
    scheduler, rng = Scheduler(profile), random.Random(seed)
    sequences: dict[int, tuple[Arrival, Sequence]] = {}
    first_token_ms: dict[int, float] = {}
    served: list[Served] = []
    now_ms, next_arrival = 0.0, 0
    while next_arrival < len(pending) or scheduler.has_work:
        if not scheduler.has_work and pending[next_arrival].arrival_ms > now_ms:
            now_ms = pending[next_arrival].arrival_ms  # idle until the next request
        while next_arrival < len(pending) and pending[next_arrival].arrival_ms <= now_ms:
            arrival = pending[next_arrival]
            sequence = Sequence(next_arrival, arrival.prompt_tokens, arrival.output_tokens)
            sequences[next_arrival] = (arrival, sequence)
            scheduler.submit(sequence)
            next_arrival += 1
        plan = scheduler.plan_step()
        if plan.is_empty:  # work that can never be scheduled would loop forever
            raise RuntimeError(f"the scheduler holds work but plans no step: {scheduler.stats()}")
        now_ms += step_ms(plan.work) * jitter_multiplier(rng, profile.jitter_fraction)
        outcome = scheduler.complete_step(plan)
        for sequence in outcome.emitted:
            if sequence.output_tokens == 1:
                first_token_ms[sequence.request_id] = now_ms
        for sequence in outcome.finished:
            arrival, _ = sequences.pop(sequence.request_id)
            served.append(Served(arrival, first_token_ms.pop(sequence.request_id), now_ms))
    return sorted(served, key=lambda request: request.arrival.arrival_ms)

