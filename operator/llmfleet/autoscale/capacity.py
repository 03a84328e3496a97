"""What one replica carries, as the planner's latency model at the learned speed says (data for
the policy, computed by the reconcile's scale step or the simulator from the plan), and the two
questions the policy asks of it: how many replicas a request rate needs, and how much lower more
replicas would put the p99 TTFT."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# Absorbs float error in rate / capacity, so that 3.0 / 1.5 is 2 replicas, not 3.
_CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class ReplicaCapacity:
    # The autoscaler's target it was modelled at (policy.target_ttft_p99_ms, with this floor).
    target_ttft_p99_ms: int
    # Requests per second one replica serves with the predicted p99 TTFT at that target; None
    # when even a vanishing load is predicted above it (the prefill alone is slower).
    requests_per_second: float | None
    # p99 TTFT predicted at a vanishing load: the prompts' own prefill and a step, which no
    # replica count shortens.
    prefill_ttft_p99_ms: float
    # TTFT of a prompt of the longest length the engine admits (maxInputLen) at a vanishing
    # load: a p99 beyond it cannot be prefill alone.
    longest_prompt_ttft_ms: float
    # The model's p99 TTFT of one replica at a request rate (per second; inf: overloaded).
    ttft_p99_ms_at: Callable[[float], float] = field(compare=False, repr=False)
    speed_factor: float = 1.0  # the learned speed the model ran at (1: the model's own)

    def describe_model(self) -> str:
        return ("the planner's model" if self.speed_factor == 1.0 else
                f"the planner's model at the learned {self.speed_factor:.2f}x speed")

    def describe(self) -> str:
        return f"{self.requests_per_second:.2f} req/s per replica ({self.describe_model()})"


def replicas_for_rate(requests_per_second: float, capacity: ReplicaCapacity) -> int:
    """The fewest replicas that carry the rate within capacity (0 for no requests)."""
    return max(0, math.ceil(requests_per_second / capacity.requests_per_second - _CEIL_SLACK))


def ttft_p99_reduction_ms(requests_per_second: float, capacity: ReplicaCapacity, current: int,
                          proposed: int) -> float:
    """How much lower the model puts the p99 TTFT on `proposed` replicas than on `current`, the
    rate spread evenly (inf when it says the current ones are overloaded)."""
    now_ms = capacity.ttft_p99_ms_at(requests_per_second / current)
    return math.inf if math.isinf(now_ms) else now_ms - capacity.ttft_p99_ms_at(requests_per_second / proposed)
