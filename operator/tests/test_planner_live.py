"""Learning from live metrics: the speed factor fitted to an observed p99 TTFT, its memory, the
observed workload, and recommendations."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from llmfleet.catalog import load_catalog
from llmfleet.planner import PlanRequest, SearchSpace, SloTargets, Workload, plan
from llmfleet.planner.latency import predict_at_load
from llmfleet.planner.live import (
    FEWER_GPUS_SPEED_MARGIN,
    MAX_SPEED_FACTOR,
    SPEED_MEMORY_REQUESTS,
    ObservedWorkload,
    engine_for_plan,
    fit_speed_factor,
    learn,
    recommend,
    workload_as_observed,
    workload_drift,
)
from llmfleet.planner.types import SpeedFactor

CATALOG = load_catalog()
H100 = "H100-SXM-80GB"
CHAT = Workload(input_tokens_mean=1000, input_tokens_p99=4000, output_tokens_mean=200, output_tokens_p99=800,
                peak_requests_per_sec=150)


def request(workload=CHAT, speed_factors=(), **space) -> PlanRequest:
    return PlanRequest(CATALOG.model("llama-3.1-8b"), workload, SloTargets(400, 20),
                       SearchSpace(gpu_types=(H100,), quantizations=("BF16", "FP8"), speed_factors=speed_factors,
                                   **space))


SERVED = plan(request())
# A histogram fine enough (2 % apart, 1 ms to 5 minutes) that its buckets pin every factor.
FINE_BOUNDS_MS = tuple(1.02 ** k for k in range(640))


def observed_at(factor: float, replicas: int = SERVED.replicas, requests: float = 2000,
                rate: float = 60.0) -> ObservedWorkload:
    """What an engine `factor` times the model's speed shows at `rate` req/s over the fleet."""
    engine = engine_for_plan(request(), SERVED)(factor)
    ttft = predict_at_load(engine, rate / replicas, CHAT.input_tokens_mean, CHAT.input_tokens_p99,
                           CHAT.output_tokens_mean, CHAT.output_tokens_p99, 0.0).ttft_p99_ms
    return ObservedWorkload(300, requests, rate, replicas, ttft)


def fit(observed: ObservedWorkload, workload: Workload = CHAT, bounds_ms=FINE_BOUNDS_MS):
    return fit_speed_factor(engine_for_plan(request(), SERVED), workload, observed, min_requests=100,
                            ttft_bounds_ms=bounds_ms)


@pytest.mark.parametrize("true_factor", [0.4, 1.0, 2.5])
def test_the_fit_finds_the_speed_at_which_the_model_reproduces_the_observed_ttft(true_factor):
    fitted = fit(observed_at(true_factor))
    assert fitted.factor == pytest.approx(true_factor, rel=0.01)
    assert f"{true_factor:.2f}x" in fitted.note


def test_no_fit_from_too_few_requests_no_ttft_or_a_ttft_past_the_histogram():
    assert fit(replace(observed_at(0.5), requests=99)).factor is None
    assert "fewer than the 100" in fit(replace(observed_at(0.5), requests=99)).note
    assert fit(replace(observed_at(0.5), ttft_p99_ms=None)).factor is None
    past_top = fit_speed_factor(engine_for_plan(request(), SERVED), CHAT, observed_at(0.5), min_requests=100,
                                ttft_bounds_ms=(1.0,))
    assert past_top.factor is None and "top bound" in past_top.note


def test_a_p99_read_from_a_wide_bucket_only_bounds_the_speed():
    """An engine at the model's speed whose requests all fall in one bucket twice as wide as the
    p99: Prometheus interpolates them to near the bucket's top, which a fit would read as a slow
    engine (the sandbox's 8B canaries: 15 ms modelled, read as 25 from 10-25 ms, fitted 0.41)."""
    at_model_speed = observed_at(1.0)
    ttft_ms = at_model_speed.ttft_p99_ms
    read_near_the_top = replace(at_model_speed, ttft_p99_ms=ttft_ms * 1.9)
    wide_bucket = (ttft_ms * 0.8, ttft_ms * 2, 300_000)
    coarse = fit(read_near_the_top, bounds_ms=wide_bucket)
    assert coarse.factor is None and "too coarse to learn from; 1.00x, known so far, is among them" in coarse.note
    # The same reading from a bucket a few percent wide is a fit.
    fine = fit(read_near_the_top, bounds_ms=(ttft_ms * 1.85, ttft_ms * 1.95, 300_000))
    assert fine.factor is not None and fine.factor < 0.8, fine
    # An engine a third of the model's speed, read from a wide bucket that excludes the model's
    # speed: the speed moves to the bucket's nearest end, not to the interpolated read.
    slow = observed_at(1 / 3)
    slow_ms = slow.ttft_p99_ms
    bounded = fit(slow, bounds_ms=(slow_ms * 0.5, slow_ms * 1.2, 300_000))
    fitted_from_the_read = fit(slow).factor
    assert fitted_from_the_read < bounded.factor < 1.0, bounded
    assert f"1.00x, known so far, is not: the nearest, {bounded.factor:.2f}x the modelled speed" in bounded.note


def test_a_ttft_faster_than_any_plausible_engine_is_clipped_and_said():
    fitted = fit(replace(observed_at(1.0), ttft_p99_ms=0.001))
    assert fitted.factor == MAX_SPEED_FACTOR and "clipped" in fitted.note


def test_learning_weighs_windows_by_requests_and_forgets_beyond_its_memory():
    first = learn(None, H100, "FP8", 0.5, 1000)
    assert (first.factor, first.requests) == (0.5, 1000)
    equal = learn(first, H100, "FP8", 2.0, 1000)
    assert equal.factor == pytest.approx(1.0) and equal.requests == 2000
    long_known = SpeedFactor(H100, "FP8", 0.5, 10 * SPEED_MEMORY_REQUESTS)
    # A change of speed is learned as if the old evidence were SPEED_MEMORY_REQUESTS requests.
    moved = learn(long_known, H100, "FP8", 2.0, SPEED_MEMORY_REQUESTS)
    assert moved.factor == pytest.approx(1.0)


def test_the_observed_workload_keeps_the_declared_tail_and_never_plans_below_the_declared_peak():
    observed = ObservedWorkload(300, 3000, 3.0, 2, 400.0, input_tokens_mean=2000, output_tokens_mean=None)
    as_seen = workload_as_observed(CHAT, observed)
    assert (as_seen.input_tokens_mean, as_seen.input_tokens_p99) == (2000, 8000)
    assert (as_seen.output_tokens_mean, as_seen.output_tokens_p99) == (200, 800)
    assert as_seen.peak_requests_per_sec == CHAT.peak_requests_per_sec
    busier = workload_as_observed(CHAT, replace(observed, requests_per_second=200.0))
    assert busier.peak_requests_per_sec == 200.0


def test_a_scaled_tail_stops_at_the_longest_request_the_engine_serves():
    """Prompts four times as long scale the declared p99 (4000) to 16000 tokens; an engine
    built for 6000-token prompts and 7000-token sequences refuses longer ones, so they were
    not among those observed."""
    observed = ObservedWorkload(300, 3000, 3.0, 2, 400.0, input_tokens_mean=4000, output_tokens_mean=400)
    limited = workload_as_observed(CHAT, observed, longest_prompt_tokens=6000, longest_sequence_tokens=7000)
    assert (limited.input_tokens_mean, limited.input_tokens_p99) == (4000, 6000)
    assert (limited.output_tokens_mean, limited.output_tokens_p99) == (400, 1000)
    assert workload_as_observed(CHAT, observed).input_tokens_p99 == 16000
    # The mean is what was served: a tail is never cut below it.
    at_limit = workload_as_observed(CHAT, replace(observed, input_tokens_mean=6500), longest_prompt_tokens=6000)
    assert at_limit.input_tokens_p99 == 6500


def test_a_plan_made_for_a_higher_observed_peak_keeps_it_through_quieter_windows():
    quiet = ObservedWorkload(300, 0, 0.0, 2, None)
    planned_peak = 3 * CHAT.peak_requests_per_sec
    assert workload_as_observed(CHAT, quiet, planned_peak).peak_requests_per_sec == planned_peak
    assert workload_drift(CHAT, replace(quiet, requests_per_second=1.05 * planned_peak), planned_peak) == ()
    (drift,) = workload_drift(CHAT, replace(quiet, requests_per_second=1.2 * planned_peak), planned_peak)
    assert drift == ("540 req/s observed, above the 450 req/s the served plan was made for "
                     "(spec.workload.peakRequestsPerSecond 150)")
    # A plan for less than the declared peak does not lower it.
    assert workload_as_observed(CHAT, quiet, 10.0).peak_requests_per_sec == CHAT.peak_requests_per_sec


def test_drift_names_each_field_that_departs_from_the_spec():
    assert workload_drift(CHAT, ObservedWorkload(300, 3000, 160, 2, 400.0, 1100, 220)) == ()
    drift = workload_drift(CHAT, ObservedWorkload(300, 3000, 170, 2, 400.0, 2000, 220))
    assert len(drift) == 2
    assert "peakRequestsPerSecond 150" in drift[0] and "inputTokensMean 1000" in drift[1]


def test_observed_prefix_reuse_replaces_the_declared_share_and_a_large_difference_is_drift():
    observed = ObservedWorkload(300, 3000, 100, 2, 400.0, prefix_reuse_fraction=0.6)
    assert workload_as_observed(CHAT, observed).prefix_sharing_fraction == 0.6
    assert workload_as_observed(CHAT, replace(observed, prefix_reuse_fraction=None)).prefix_sharing_fraction == 0.0
    (drift,) = workload_drift(CHAT, observed)
    assert drift == "60% of prompt tokens reused from the KV cache against spec.workload.prefixSharingFraction 0"
    assert workload_drift(CHAT, replace(observed, prefix_reuse_fraction=0.1)) == ()


def test_a_slower_engine_than_modelled_asks_for_more_gpus():
    slow = request(speed_factors=(SpeedFactor(H100, SERVED.quantization, 0.4, 5000),))
    advice = recommend(slow, SERVED, (), replicas_autoscaled=False)
    assert advice is not None and advice.reason == "SloAtRisk"
    assert advice.plan.gpus_total > SERVED.gpus_total
    assert "0.40x (5000 requests)" in advice.message and f"({SERVED.gpus_total} GPUs)" in advice.message
    assert any("ran at 0.40x the modelled speed" in line for line in advice.plan.rationale)


def test_a_faster_engine_than_modelled_is_a_cheaper_plan_and_an_exact_model_recommends_nothing():
    fast = request(speed_factors=(SpeedFactor(H100, SERVED.quantization, 3.0, 5000),))
    advice = recommend(fast, SERVED, (), replicas_autoscaled=False)
    assert advice is not None and advice.reason == "CheaperPlan"
    assert advice.plan.gpus_total < SERVED.gpus_total
    assert recommend(request(), SERVED, (), replicas_autoscaled=False) is None


def test_fewer_gpus_are_recommended_only_when_they_hold_with_a_margin_on_the_learned_speed():
    def planned_gpus(factor: float) -> int:
        return plan(request(speed_factors=(SpeedFactor(H100, SERVED.quantization, factor, 5000),))).gpus_total

    # The lowest learned speed at which the planner alone would take a GPU away, to 1 %.
    low, high = 1.0, 3.0
    while high / low > 1.01:
        low, high = (low, (low + high) / 2) if planned_gpus((low + high) / 2) < SERVED.gpus_total \
            else ((low + high) / 2, high)
    assert planned_gpus(high) < SERVED.gpus_total
    just_faster = request(speed_factors=(SpeedFactor(H100, SERVED.quantization, high, 5000),))
    assert recommend(just_faster, SERVED, (), replicas_autoscaled=False) is None
    with_margin = high * (1 + FEWER_GPUS_SPEED_MARGIN) * 1.01
    advice = recommend(request(speed_factors=(SpeedFactor(H100, SERVED.quantization, with_margin, 5000),)),
                       SERVED, (), replicas_autoscaled=False)
    assert advice is not None and advice.reason == "CheaperPlan" and advice.plan.gpus_total < SERVED.gpus_total
    assert "less a 20% margin" in advice.message
    assert any(f"use {with_margin / 1.2:.2f}x, that less a 20% margin" in line for line in advice.plan.rationale)
    # The margin is the planner's: a plan with more GPUs is made at the learned speed.
    slow = request(speed_factors=(SpeedFactor(H100, SERVED.quantization, 0.4, 5000),))
    assert recommend(slow, SERVED, (), replicas_autoscaled=False).plan.gpus_total == plan(slow).gpus_total


def test_with_an_autoscaler_a_change_of_replicas_alone_is_left_to_it():
    slightly_slow = request(speed_factors=(SpeedFactor(H100, SERVED.quantization, 0.8, 5000),))
    advice = recommend(slightly_slow, SERVED, (), replicas_autoscaled=False)
    assert advice is not None and advice.plan.quantization == SERVED.quantization
    assert advice.plan.tensor_parallel_size == SERVED.tensor_parallel_size
    assert recommend(slightly_slow, SERVED, (), replicas_autoscaled=True) is None


def test_drift_is_the_reason_when_the_workload_changed():
    busier = replace(CHAT, peak_requests_per_sec=3 * CHAT.peak_requests_per_sec)
    advice = recommend(request(workload=busier), SERVED, ("450 req/s observed",), replicas_autoscaled=False)
    assert advice is not None and advice.reason == "WorkloadDrift" and "450 req/s observed" in advice.message
    assert math.isclose(advice.plan.gpus_total / SERVED.gpus_total, 3, rel_tol=0.5)
