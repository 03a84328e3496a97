"""What one replica carries, as the planner's latency model at the learned speed says (data for
the policy, computed by the reconcile's scale step or the simulator from the plan), and the
policy's rules on it: how many replicas the request rate (now, at the window's peak, as its trend
forecasts) needs, whether a scale-up would lower the p99 TTFT enough to matter, and how low a
p99 must be for a scale-down above the prefill floor. docs/autoscaling.md, "Capacity"."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from llmfleet.api import AutoscalingSpec
from llmfleet.api.status import ScalingSignal
from llmfleet.autoscale.snapshot import MetricsSnapshot

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


def replicas_for_rate(requests_per_second: float, per_replica: float) -> int:
    """The fewest replicas that carry the rate at `per_replica` requests/s each (0 for none)."""
    return max(0, math.ceil(requests_per_second / per_replica - _CEIL_SLACK))


def carried_requests_per_second(snapshot: MetricsSnapshot, target_ms: int, current: int,
                                capacity: ReplicaCapacity) -> float:
    """Requests/s a replica carries at the target: the model's, or what each replica carries now
    with the p99 TTFT at or under the target where that is more. The model can be pessimistic
    (its wait for a batch slot is the conservative M/M/c one: at 4-sequence batches it puts a
    replica at about a third of what the emulator serves), and an observation beats it."""
    rate, ttft = snapshot.requests_per_second, snapshot.ttft_p99_ms
    seen = rate / current if rate and ttft is not None and ttft <= target_ms else 0.0
    return max(capacity.requests_per_second, seen)


def ttft_p99_reduction_ms(requests_per_second: float, capacity: ReplicaCapacity, current: int,
                          proposed: int) -> float:
    """How much lower the model puts the p99 TTFT on `proposed` replicas than on `current`, the
    rate spread evenly (inf when it says the current ones are overloaded)."""
    now_ms = capacity.ttft_p99_ms_at(requests_per_second / current)
    return math.inf if math.isinf(now_ms) else now_ms - capacity.ttft_p99_ms_at(requests_per_second / proposed)


def forecast_requests_per_second(spec: AutoscalingSpec, snapshot: MetricsSnapshot) -> float | None:
    """The request rate its trend reaches spec.autoscaling.rateForecastSeconds ahead; None
    while it does not rise (a falling rate is left to the stabilisation window) or is unknown."""
    rate, trend = snapshot.requests_per_second, snapshot.requests_per_second_trend
    if rate is None or trend is None or trend <= 0 or spec.rate_forecast_seconds == 0:
        return None
    return rate + trend * spec.rate_forecast_seconds


def rate_rule(spec: AutoscalingSpec, target_ms: int, snapshot: MetricsSnapshot, current: int,
              capacity: ReplicaCapacity, proposed: int, why: str) -> tuple[int, ScalingSignal, str] | None:
    """(replicas, signal, reason) where the rate overrides the p99 feedback's `proposed` count
    (`why`): raised to what the rate, now or as its trend forecasts, needs at the capacity; a
    scale-down cut to what the window's peak rate needs, or refused. None where the p99
    feedback stands."""
    rate = snapshot.requests_per_second or 0.0
    forecast = forecast_requests_per_second(spec, snapshot)
    per_replica = carried_requests_per_second(snapshot, target_ms, current, capacity)
    basis = (capacity.describe() if per_replica == capacity.requests_per_second else
             f"{per_replica:.2f} req/s per replica (carried now within the target; {capacity.describe()})")
    at_target = f"at the {target_ms} ms target"
    if proposed < current:
        peak = max(rate, snapshot.requests_per_second_peak or 0.0, forecast or 0.0)
        needed = replicas_for_rate(peak, per_replica)
        window = (f"over the {snapshot.peak_window_seconds} s stabilisation window"
                  if snapshot.peak_window_seconds else "in the window")
        seen = f"the {peak:.2f} req/s peak {window}"
        if needed >= current:
            fewer = current - 1
            return current, ScalingSignal.REQUEST_RATE, (
                f"{why}, but {seen} would put {peak / max(fewer, 1):.2f} req/s on each of "
                f"{fewer} replicas, above the {basis} {at_target}: holding {current}")
        if needed > proposed:
            return needed, ScalingSignal.REQUEST_RATE, (
                f"{why}; {seen} needs {needed} replicas at {basis} {at_target}")
        return None
    by_rate = replicas_for_rate(rate, per_replica)
    by_forecast = replicas_for_rate(forecast, per_replica) if forecast is not None else 0
    needed = max(by_rate, by_forecast)
    if needed <= proposed:
        return None
    if by_forecast > by_rate:
        return needed, ScalingSignal.RATE_FORECAST, (
            f"the request rate rises by {snapshot.requests_per_second_trend:.3f} req/s per second: "
            f"{rate:.2f} req/s now, {forecast:.2f} in {spec.rate_forecast_seconds} s, which needs {needed} "
            f"replicas at {basis} {at_target} ({why})")
    return needed, ScalingSignal.REQUEST_RATE, (
        f"{rate:.2f} req/s needs {needed} replicas at {basis} {at_target} ({why})")


def futile_scale_up(spec: AutoscalingSpec, target_ms: int, requests_per_second: float,
                    capacity: ReplicaCapacity, current: int, proposed: int) -> str | None:
    """Why a scale-up would not lower the p99 TTFT enough to matter, when the model says so: the
    replicas are far from saturation, so what they show above the target is the prompts' own
    prefill (long prompts), which no replica count shortens. Enough is the tolerance band."""
    band_ms = spec.tolerance_percent / 100 * target_ms
    reduction_ms = ttft_p99_reduction_ms(requests_per_second, capacity, current, proposed)
    if reduction_ms > band_ms:
        return None
    return (f"at {requests_per_second / current:.2f} req/s per replica {capacity.describe_model()} predicts "
            f"a p99 TTFT only {reduction_ms:.0f} ms lower on {proposed} replicas than on {current}, within the "
            f"{spec.tolerance_percent:g}% tolerance ({band_ms:.0f} ms): the p99 is set by the prompts' own "
            f"prefill ({capacity.prefill_ttft_p99_ms:.0f} ms at the p99 prompt, up to "
            f"{capacity.longest_prompt_ttft_ms:.0f} ms at the longest admitted), which no replica count shortens")


def scale_down_threshold(target_ms: int, capacity: ReplicaCapacity | None, fraction: float) -> tuple[float, str]:
    """(ms, in words) the p99 TTFT must be under for a scale-down: half the target, since TTFT
    climbs steeply near saturation and a removed replica's load lands on the others. With the
    prefill floor known, half of what the target leaves above it: the floor does not grow with
    load, and a floor above half the target would otherwise forbid every scale-down."""
    if capacity is None or capacity.prefill_ttft_p99_ms >= target_ms:
        return fraction * target_ms, f"{fraction:.0%} of the {target_ms} ms target"
    floor = capacity.prefill_ttft_p99_ms
    low = floor + fraction * (target_ms - floor)
    return low, (f"{low:.0f} ms (the {floor:.0f} ms prefill floor plus {fraction:.0%} of the "
                 f"{target_ms} ms target's room above it)")
