"""What one replica of a plan carries (pure): the request rate at which the latency model, at the
speed learned for the plan's configuration, predicts a p99 TTFT at a target, and the p99 TTFT
left at a vanishing load. The autoscaler sizes the fleet on it (llmfleet.autoscale.capacity)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llmfleet.autoscale.capacity import ReplicaCapacity
from llmfleet.catalog import Catalog
from llmfleet.planner.latency import Engine, predict_at_load, saturation_throughput_tokens_per_sec
from llmfleet.planner.live import engine_for_plan
from llmfleet.planner.types import Plan, PlanRequest, Workload

# Bisection on the rate: 2^-30 of one replica's saturation rate is finer than any rate measured.
_BISECTION_STEPS = 30


def _ttft_p99_ms(engine: Engine, workload: Workload, requests_per_second: float) -> float:
    w = workload
    return predict_at_load(engine, requests_per_second, w.input_tokens_mean, w.input_tokens_p99,
                           w.output_tokens_mean, w.output_tokens_p99, w.prefix_sharing_fraction).ttft_p99_ms


def engine_capacity(engine: Engine, workload: Workload, target_at_floor: Callable[[float], int],
                    longest_prompt_tokens: int, speed_factor: float) -> ReplicaCapacity:
    """`engine`'s capacity for `workload` at the target `target_at_floor` sets for its prefill
    floor (the model's p99 TTFT rises with the rate, as the planner's replica search takes it)."""
    def at(requests_per_second: float) -> float:
        return _ttft_p99_ms(engine, workload, requests_per_second)

    floor_ms = at(0.0)
    longest = replace(workload, input_tokens_mean=longest_prompt_tokens, input_tokens_p99=longest_prompt_tokens)
    longest_ms = _ttft_p99_ms(engine, longest, 0.0)
    target_ttft_p99_ms = target_at_floor(floor_ms)
    if floor_ms > target_ttft_p99_ms:
        return ReplicaCapacity(target_ttft_p99_ms, None, floor_ms, longest_ms, at, speed_factor)
    w = workload
    low, high = 0.0, saturation_throughput_tokens_per_sec(
        engine, w.input_tokens_mean, w.output_tokens_mean,
        w.input_tokens_mean * w.prefix_sharing_fraction) / w.output_tokens_mean
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if at(middle) <= target_ttft_p99_ms:
            low = middle
        else:
            high = middle
    return ReplicaCapacity(target_ttft_p99_ms, low, floor_ms, longest_ms, at, speed_factor)


def replica_capacity(request: PlanRequest, served: Plan, target_at_floor: Callable[[float], int],
                     longest_prompt_tokens: int, catalog: Catalog | None = None) -> ReplicaCapacity:
    """One replica of the served plan for the request's workload, at the speed the request's
    space learned for its GPU type and format (the model's own where none is learned), at the
    autoscaler's target for the modelled prefill floor (`target_at_floor`); prompts of up to
    `longest_prompt_tokens` (the engine's maxInputLen)."""
    learned = request.space.speed_factor(served.gpu_type, served.quantization)
    factor = learned.factor if learned is not None else 1.0
    engine = engine_for_plan(request, served, catalog)(factor)
    return engine_capacity(engine, request.workload, target_at_floor, longest_prompt_tokens, factor)
