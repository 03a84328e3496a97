"""The emulated engine run in virtual time: the same scheduler and step costs as the sandbox's
served emulator (scheduler.py, timing.py), without threads, Triton or a wall clock, so an hour
of traffic takes seconds. What the planner's queueing model is checked against, and each
replica of `llmfleet simulate`.

A request that arrives while a step runs joins at the next step, as in the served engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.scheduler import Scheduler, Sequence, StepOutcome, StepPlan
from llmfleet.simulation.timing import StepWork, jitter_multiplier, step_duration_ms

StepCost = Callable[[StepWork], float]


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


class VirtualEngine:
    """One engine's step loop in virtual time: `start_step` plans a step at a time and says when
    it ends; `finish_step` completes it then. Steps are jittered from the engine's own seeded
    generator, one draw per step, as the served engine's are."""

    def __init__(self, profile: EngineProfile, seed: int = 0, step_ms: StepCost | None = None):
        self.profile = profile
        self.scheduler = Scheduler(profile)
        self._rng = random.Random(seed)
        self._step_ms = step_ms or (lambda work: step_duration_ms(profile, work))
        self._step: StepPlan | None = None
        self.step_end_ms: float | None = None  # None: no step runs

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def start_step(self, now_ms: float) -> float:
        """Plan the next step at `now_ms`; its end time. The engine must have work."""
        plan = self.scheduler.plan_step()
        if plan.is_empty:  # work that can never be scheduled would loop forever
            raise RuntimeError(f"the scheduler holds work but plans no step: {self.scheduler.stats()}")
        self._step = plan
        self.step_end_ms = now_ms + self._step_ms(plan.work) * jitter_multiplier(
            self._rng, self.profile.jitter_fraction)
        return self.step_end_ms

    def finish_step(self) -> StepOutcome:
        plan, self._step, self.step_end_ms = self._step, None, None
        return self.scheduler.complete_step(plan)


def serve(profile: EngineProfile, arrivals: Iterable[Arrival], seed: int = 0,
          step_ms: StepCost | None = None) -> list[Served]:
    """Every arrival served to its last token by one engine, in arrival order. `step_ms`: what
    a step's work costs, the profile's linear cost (the served emulator's) unless another model
    is given."""
    pending = sorted(arrivals, key=lambda arrival: arrival.arrival_ms)
    engine = VirtualEngine(profile, seed, step_ms)
    sequences: dict[int, tuple[Arrival, Sequence]] = {}
    first_token_ms: dict[int, float] = {}
    served: list[Served] = []
    now_ms, next_arrival = 0.0, 0
    while next_arrival < len(pending) or engine.has_work:
        if not engine.has_work and pending[next_arrival].arrival_ms > now_ms:
            now_ms = pending[next_arrival].arrival_ms  # idle until the next request
        while next_arrival < len(pending) and pending[next_arrival].arrival_ms <= now_ms:
            arrival = pending[next_arrival]
            sequence = Sequence(next_arrival, arrival.prompt_tokens, arrival.output_tokens)
            sequences[next_arrival] = (arrival, sequence)
            engine.scheduler.submit(sequence)
            next_arrival += 1
        now_ms = engine.start_step(now_ms)
        outcome = engine.finish_step()
        for sequence in outcome.emitted:
            if sequence.output_tokens == 1:
                first_token_ms[sequence.request_id] = now_ms
        for sequence in outcome.finished:
            arrival, _ = sequences.pop(sequence.request_id)
            served.append(Served(arrival, first_token_ms.pop(sequence.request_id), now_ms))
    return sorted(served, key=lambda request: request.arrival.arrival_ms)
