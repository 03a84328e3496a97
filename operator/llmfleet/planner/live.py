"""Learning from live metrics (pure): how fast a configuration really runs, what the workload
really is, and whether another plan would serve it better.

The model is corrected by one number per (model, GPU type, weight format), a *speed factor*:
the multiplier on the engine's compute and memory efficiencies with which the planner's
latency model reproduces the p99 TTFT observed at the observed per-replica load. It is the
quantity the autoscaler and the SLO are about, and the one the engine's metrics give in both
runtimes (a TTFT histogram); TPOT has no histogram there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from llmfleet.api.conditions import Reason
from llmfleet.catalog import Catalog, load_catalog
from llmfleet.planner.latency import Engine, predict_at_load
from llmfleet.planner.search import plan as make_plan
from llmfleet.planner.search import engine_in_space, plan_option, resolve_model
from llmfleet.planner.types import Plan, PlanRequest, SpeedFactor, Workload

# Beyond these the model is not wrong by a factor but about something else (a broken engine, a
# histogram bound): the fit is clipped and says so.
MIN_SPEED_FACTOR = 1 / 8
MAX_SPEED_FACTOR = 8.0
# Requests after which older evidence weighs no more than a new window's: an engine that
# changes speed (a new build of the same format) is relearned within a few windows.
SPEED_MEMORY_REQUESTS = 10_000
# Workload drift: the observed rate above the declared peak, a mean length this far off, or
# prefix reuse this far from the declared share.
RATE_DRIFT = 0.10
LENGTH_DRIFT = 0.25
PREFIX_DRIFT = 0.2  # absolute: a share of prompt tokens
# A re-plan builds an engine and rolls it out, and speeds fitted to different configurations
# of one (model, GPU, format) need not agree: a plan with fewer GPUs than the served one is
# recommended only if it meets the SLO with the learned speed this much lower, so the next
# window's fit cannot send the deployment straight back.
FEWER_GPUS_SPEED_MARGIN = 0.2
_BISECTION_STEPS = 40
# The widest range of speed factors a p99's histogram bucket may allow for its interpolated value
# to be fitted: a learned factor moves every later plan of the model, and a p99 of 15 ms read from
# a 10-25 ms bucket says only "somewhere between 0.4x and 3.4x", which bounds the factor instead.
MAX_SPEED_FIT_SPREAD = 1.5


@dataclass(frozen=True)
class ObservedWorkload:
    """One revision's traffic over a window, from its engines' metrics."""

    window_seconds: int
    requests: float  # first tokens in the window
    requests_per_second: float
    replicas: int  # serving pods that reported
    ttft_p99_ms: float | None
    # None: the serving release exports no token-length histograms.
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    # The share of prompt tokens the KV cache reused (None: not exported).
    prefix_reuse_fraction: float | None = None
    error: str | None = None  # Prometheus did not answer; nothing else is known


@dataclass(frozen=True)
class SpeedFit:
    """A speed factor fitted to one observation, or why none was."""

    factor: float | None
    note: str


@dataclass(frozen=True)
class Recommendation:
    reason: str  # Reason.WORKLOAD_DRIFT, SLO_AT_RISK or CHEAPER_PLAN
    message: str
    plan: Plan


def _peak(declared: Workload, planned_peak_requests_per_sec: float | None) -> float:
    return max(declared.peak_requests_per_sec, planned_peak_requests_per_sec or 0.0)


def workload_as_observed(declared: Workload, observed: ObservedWorkload,
                         planned_peak_requests_per_sec: float | None = None, *,
                         longest_prompt_tokens: int | None = None,
                         longest_sequence_tokens: int | None = None) -> Workload:
    """The declared workload with what was observed: mean lengths and prefix reuse where the
    release exports them (the p99s scaled with the means, keeping the declared tail), and the
    observed rate where it is above the peak. The peak is the declared one or, when higher, the
    one the served plan was made for: a re-plan for traffic above the declared peak holds
    through quieter windows (a revision's first, a lull), which would otherwise plan it away.
    A scaled tail stops at what the engine serves (`longest_prompt_tokens`: maxInputLen;
    `longest_sequence_tokens`: maxSeqLen, prompt and answer): it refuses longer requests, so
    none of them is in what was observed."""
    def scaled(mean: float, p99: float, seen: float | None, longest: float | None) -> tuple[float, float]:
        if seen is not None and seen > 0:
            mean, p99 = seen, max(seen, p99 * seen / mean)
        return mean, p99 if longest is None else max(mean, min(p99, longest))

    input_mean, input_p99 = scaled(declared.input_tokens_mean, declared.input_tokens_p99, observed.input_tokens_mean,
                                   longest_prompt_tokens)
    output_mean, output_p99 = scaled(declared.output_tokens_mean, declared.output_tokens_p99,
                                     observed.output_tokens_mean,
                                     None if longest_sequence_tokens is None else longest_sequence_tokens - input_p99)
    prefix_limit = (input_mean - 1) / input_mean
    prefix = declared.prefix_sharing_fraction if observed.prefix_reuse_fraction is None else \
        max(0.0, observed.prefix_reuse_fraction)
    return Workload(input_mean, input_p99, output_mean, output_p99,
                    max(_peak(declared, planned_peak_requests_per_sec), observed.requests_per_second),
                    min(prefix, prefix_limit))


def workload_drift(declared: Workload, observed: ObservedWorkload,
                   planned_peak_requests_per_sec: float | None = None) -> tuple[str, ...]:
    """How the observed workload departs from the declared one (its rate from the peak the
    served plan was made for, when that is higher), one statement per field."""
    drift = []
    peak = _peak(declared, planned_peak_requests_per_sec)
    if observed.requests_per_second > peak * (1 + RATE_DRIFT):
        declared_peak = f"spec.workload.peakRequestsPerSecond {declared.peak_requests_per_sec:g}"
        above = declared_peak if peak == declared.peak_requests_per_sec else \
            f"the {peak:.3g} req/s the served plan was made for ({declared_peak})"
        drift.append(f"{observed.requests_per_second:.3g} req/s observed, above {above}")
    for seen, mean, field in ((observed.input_tokens_mean, declared.input_tokens_mean, "inputTokensMean"),
                              (observed.output_tokens_mean, declared.output_tokens_mean, "outputTokensMean")):
        if seen is not None and abs(seen / mean - 1) > LENGTH_DRIFT:
            drift.append(f"mean {seen:.0f} tokens observed against spec.workload.{field} {mean:g}")
    reuse = observed.prefix_reuse_fraction
    if reuse is not None and abs(reuse - declared.prefix_sharing_fraction) > PREFIX_DRIFT:
        drift.append(f"{reuse:.0%} of prompt tokens reused from the KV cache against "
                     f"spec.workload.prefixSharingFraction {declared.prefix_sharing_fraction:g}")
    return tuple(drift)


def fit_speed_factor(engine_at: Callable[[float], Engine], workload: Workload, observed: ObservedWorkload,
                     *, min_requests: int, ttft_bounds_ms: Sequence[float], known_factor: float = 1.0) -> SpeedFit:
    """The speed factor with which the model predicts the observed p99 TTFT at the observed
    per-replica rate and lengths (`workload` with them, `workload_as_observed`). Predicted TTFT
    falls as the factor rises, so bisection on its logarithm finds it.

    Prometheus knows the p99 only to within its histogram bucket (`ttft_bounds_ms`, the served
    revision's) and interpolates inside it: where nearly every request falls in one wide bucket
    the p99 reads near its top whatever the engine's speed. So the fit is the factor only when
    every p99 in that bucket gives about the same one; else the bucket only bounds the speed,
    and the fit is the factor believed so far (`known_factor`) moved just within those bounds,
    or none where it already lies within them."""
    if observed.ttft_p99_ms is None or observed.replicas < 1:
        return SpeedFit(None, "no first tokens in the window")
    if observed.requests < min_requests:
        return SpeedFit(None, f"{observed.requests:.0f} requests in the window, fewer than the {min_requests} "
                              "a fit needs")
    top_ms = ttft_bounds_ms[-1]
    if observed.ttft_p99_ms >= top_ms:
        return SpeedFit(None, f"p99 TTFT beyond the histogram's top bound ({top_ms:g} ms)")
    rate = observed.requests_per_second / observed.replicas

    def predicted_ms(factor: float) -> float:
        return predict_at_load(engine_at(factor), rate, workload.input_tokens_mean, workload.input_tokens_p99,
                               workload.output_tokens_mean, workload.output_tokens_p99,
                               workload.prefix_sharing_fraction).ttft_p99_ms

    def factor_predicting(ttft_ms: float) -> float:
        low, high = math.log(MIN_SPEED_FACTOR), math.log(MAX_SPEED_FACTOR)
        for _ in range(_BISECTION_STEPS):
            middle = (low + high) / 2
            if predicted_ms(math.exp(middle)) > ttft_ms:
                low = middle
            else:
                high = middle
        return math.exp((low + high) / 2)

    target = observed.ttft_p99_ms
    if predicted_ms(MAX_SPEED_FACTOR) > target:
        return SpeedFit(MAX_SPEED_FACTOR, f"faster than {MAX_SPEED_FACTOR:g}x the model; clipped")
    if predicted_ms(MIN_SPEED_FACTOR) < target:
        return SpeedFit(MIN_SPEED_FACTOR, f"slower than 1/{1 / MIN_SPEED_FACTOR:g} of the model; clipped")
    bucket_top_ms = min(bound for bound in ttft_bounds_ms if bound >= target)
    bucket_bottom_ms = max((bound for bound in ttft_bounds_ms if bound < target), default=0.0)
    slowest = factor_predicting(bucket_top_ms)
    fastest = factor_predicting(bucket_bottom_ms) if bucket_bottom_ms > 0 else MAX_SPEED_FACTOR
    if fastest / slowest > MAX_SPEED_FIT_SPREAD:
        bucket = (f"p99 TTFT {target:.0f} ms lies in the histogram's {bucket_bottom_ms:g}-{bucket_top_ms:g} ms "
                  f"bucket, where any speed from {slowest:.2f}x to {fastest:.2f}x the modelled one would put it")
        if slowest <= known_factor <= fastest:
            return SpeedFit(None, f"{bucket}: too coarse to learn from; {known_factor:.2f}x, known so far, is "
                                  "among them")
        nearest = min(max(known_factor, slowest), fastest)
        return SpeedFit(nearest, f"{bucket}; {known_factor:.2f}x, known so far, is not: the nearest, "
                                 f"{nearest:.2f}x the modelled speed")
    factor = factor_predicting(target)
    return SpeedFit(factor, f"p99 TTFT {target:.0f} ms at {rate:.3g} req/s per replica: "
                            f"{factor:.2f}x the modelled speed")


def learn(previous: SpeedFactor | None, gpu_type: str, quantization: str, fitted: float,
          requests: int) -> SpeedFactor:
    """The speed factor after one more fitted window: the request-weighted geometric mean of
    the old and the new, the old counting for at most `SPEED_MEMORY_REQUESTS` requests."""
    if previous is None:
        return SpeedFactor(gpu_type, quantization, fitted, requests)
    kept = min(previous.requests, SPEED_MEMORY_REQUESTS)
    weight = requests / (requests + kept)
    factor = math.exp((1 - weight) * math.log(previous.factor) + weight * math.log(fitted))
    return SpeedFactor(gpu_type, quantization, factor, previous.requests + requests)


def engine_for_plan(request: PlanRequest, current: Plan, catalog: Catalog | None = None
                    ) -> Callable[[float], Engine]:
    """The served configuration's engine, as a function of its speed factor."""
    catalog = catalog or load_catalog()
    model, option = resolve_model(request.model, catalog), plan_option(current, catalog)
    return lambda factor: engine_in_space(model, option, catalog, request.space, factor)


def _label(p: Plan) -> str:
    return (f"{p.replicas} x {p.gpu_type} TP{p.tensor_parallel_size} {p.quantization} KV {p.kv_cache_dtype} "
            f"({p.gpus_total} GPUs)")


def _meets_slo(request: PlanRequest, current: Plan, catalog: Catalog | None) -> bool:
    pinned = replace(request.space, pinned_gpu_type=current.gpu_type, pinned_quantization=current.quantization,
                     pinned_tensor_parallel_size=current.tensor_parallel_size,
                     pinned_kv_cache_dtype=current.kv_cache_dtype, pinned_replicas=current.replicas,
                     cluster_gpus=None)
    return make_plan(replace(request, space=pinned), catalog).feasible


def recommend(request: PlanRequest, current: Plan, drift: tuple[str, ...], *, replicas_autoscaled: bool,
              catalog: Catalog | None = None) -> Recommendation | None:
    """A plan for `request` (the observed workload, the learned speed factors) when it differs
    from `current` in what a re-plan would change: the configuration, or the replicas when no
    autoscaler sets them. None when the current plan stands or nothing meets the SLO. A plan
    with fewer GPUs is made with every speed `FEWER_GPUS_SPEED_MARGIN` slower than learned."""
    candidate = make_plan(request, catalog)
    if not candidate.feasible:
        return None
    if candidate.gpus_total < current.gpus_total:
        candidate = make_plan(replace(request, space=replace(request.space, speed_margin=FEWER_GPUS_SPEED_MARGIN)),
                              catalog)
        if not candidate.feasible or candidate.gpus_total >= current.gpus_total:
            return None
    configuration = ("gpu_type", "tensor_parallel_size", "quantization", "kv_cache_dtype")
    same_configuration = all(getattr(candidate, f) == getattr(current, f) for f in configuration)
    if same_configuration and (replicas_autoscaled or candidate.replicas == current.replicas):
        return None
    if drift:
        reason, why = Reason.WORKLOAD_DRIFT, "; ".join(drift)
    elif not _meets_slo(request, current, catalog):
        reason, why = Reason.SLO_AT_RISK, "with the learned speeds the served plan misses the SLO at the peak"
    elif candidate.gpus_total < current.gpus_total:
        reason, why = Reason.CHEAPER_PLAN, (f"with the learned speeds less a {FEWER_GPUS_SPEED_MARGIN:.0%} margin "
                                            "a plan with fewer GPUs meets the SLO")
    else:
        return None
    learned = [f"{s.gpu_type} {s.quantization} {s.factor:.2f}x ({s.requests} requests)"
               for s in request.space.speed_factors]
    message = (f"{why}: {_label(current)} -> {_label(candidate)}"
               + (f"; learned speeds: {', '.join(learned)}" if learned else ""))
    return Recommendation(reason, message, replace(candidate, rationale=(*candidate.rationale, f"{reason}: {why}")))
