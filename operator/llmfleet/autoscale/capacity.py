"""What one replica carries, as the planner's latency model at the learned speed says (data for
the policy, computed by the reconcile's scale step or the simulator from the plan), and the two
questions the policy asks of it: how many replicas a request rate needs, and how much of a p99
TTFT more replicas could take away."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Absorbs float error in rate / capacity, so that 3.0 / 1.5 is 2 replicas, not 3.
_CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class ReplicaCapacity:
    # Requests per second one replica serves with the predicted p99 TTFT at the autoscaler's
    # target; None when even a vanishing load is predicted above it (the prefill alone is slower).
    requests_per_second: float | None
    # p99 TTFT predicted at a vanishing load: the prompts' own prefill and a step, which no
    # replica count shortens.
    prefill_ttft_p99_ms: float
    speed_factor: float = 1.0  # the learned speed the model ran at (1: the model's own)

    def describe(self) -> str:
        speed = "the planner's model" if self.speed_factor == 1.0 else \
            f"the planner's model at the learned {self.speed_factor:.2f}x speed"
        return f"{self.requests_per_second:.2f} req/s per replica ({speed})"


def replicas_for_rate(requests_per_second: float, capacity: ReplicaCapacity) -> int:
    """The fewest replicas that carry the rate within capacity (0 for no requests)."""
    return max(0, math.ceil(requests_per_second / capacity.requests_per_second - _CEIL_SLACK))


def waiting_ms(observed_ttft_p99_ms: float, capacity: ReplicaCapacity) -> float:
    """The part of an observed p99 TTFT above the prefill floor: waiting for a batch slot or for
    the engine, the most that more replicas could take away."""
    return max(0.0, observed_ttft_p99_ms - capacity.prefill_ttft_p99_ms)
