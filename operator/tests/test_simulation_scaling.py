"""Capacity-aware scaling in the fleet simulator (issue 30 part 3): the demo's load scales down
without a breach and without a reversal, also on an engine slower than the model (the speed the
sandbox learned); a long-prompt load whose p99 TTFT is the prefill's gets no replicas that
cannot help."""

from __future__ import annotations

import argparse
import collections
from dataclasses import fields, replace

import pytest
import yaml

import llmfleet.simulation.fleet as simulation_fleet
from llmfleet.api import LLMDeploymentSpec
from llmfleet.api.status import ScalingDecision, ScalingSignal
from llmfleet.autoscale import target_ttft_p99_ms
from llmfleet.catalog import load_catalog
from llmfleet.loadgen.command import length_distributions, open_loop_plan
from llmfleet.planner.capacity import replica_capacity
from llmfleet.planner.search import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.planner.types import SpeedFactor
from llmfleet.simulation.deployment import exported_queue_series, fleet_for, query_window_seconds
from llmfleet.simulation.fleet import Fleet, FleetRun, FleetSettings, simulate
from llmfleet.simulation.replica import Arrival
from llmfleet.simulation.routing import DEFAULT_ROUTING, RANDOM, ROUND_ROBIN
from llmfleet_sandbox.manager import DEMO_LOAD_ARGS, DEMO_MANIFEST

CATALOG = load_catalog()
# `llmfleet simulate`'s defaults: the chart's scrape, the operator's pass, the sandbox's start-up.
SCRAPE_INTERVAL_S, RECONCILE_INTERVAL_S, START_UP_DELAY_S = 15.0, 5.0, 8.0
# The demo's last step (1 request/s) held long enough for every scale-down it allows.
DEMO_EXTENDED_S = 600.0
# What the sandbox's operator learned of the demo's engine (issue 30): 0.56x the model.
SANDBOX_SPEED = 0.56


def demo_spec() -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(yaml.safe_load(DEMO_MANIFEST.read_text())["spec"])


def long_prompt_spec() -> LLMDeploymentSpec:
    """The demo's model for long prompts, a 1 s SLO: the p99 prompt's prefill alone takes most
    of it (the model puts it at about 730 ms on the plan's H100 x2 FP8)."""
    spec = yaml.safe_load(DEMO_MANIFEST.read_text())["spec"]
    spec["engine"].update(maxBatchSize=64, maxInputLen=16384, maxSeqLen=17408, maxNumTokens=16384)
    spec["slo"] = {"ttftP99Ms": 1000, "tpotP99Ms": 50}
    spec["workload"] = {"inputTokensMean": 3000, "inputTokensP99": 9000, "outputTokensMean": 128,
                        "outputTokensP99": 256, "peakRequestsPerSecond": 1}
    spec["resources"]["allowedTensorParallelSizes"] = [2]
    return LLMDeploymentSpec.model_validate(spec)


def arrivals(load_args, seed: int, duration_s: float | None = None) -> list[Arrival]:
    flags = dict(zip(load_args[::2], load_args[1::2]))
    args = argparse.Namespace(schedule=flags["--schedule"], trace=None, seed=seed,
                              duration_s=duration_s or float(flags["--duration-s"]),
                              input_tokens=flags["--input-tokens"], output_tokens=flags["--output-tokens"])
    requests, _ = open_loop_plan(args, *length_distributions(args))
    return [Arrival(r.arrival_s * 1000, r.input_tokens, r.output_tokens) for r in requests]


def settings_for(spec: LLMDeploymentSpec, seed: int, routing: str = DEFAULT_ROUTING) -> FleetSettings:
    return FleetSettings(SCRAPE_INTERVAL_S, query_window_seconds(SCRAPE_INTERVAL_S), RECONCILE_INTERVAL_S,
                         START_UP_DELAY_S, routing=routing, seed=seed, **exported_queue_series(spec))


def slower(fleet: Fleet, spec: LLMDeploymentSpec, served, speed: float) -> Fleet:
    """The fleet on engines whose decode steps run at `speed` of the model's (the sandbox's host
    is slower at the batch work than at a lone prompt), and the autoscaler told the speed its
    operator learned."""
    profile = fleet.engine.profile
    slow = {f.name: getattr(profile, f.name) / speed for f in fields(profile) if f.name.startswith("decode_step")}
    request = plan_request_from_spec(spec, catalog=CATALOG)
    learned = replace(request, space=replace(request.space, speed_factors=(
        SpeedFactor(served.gpu_type, served.quantization, speed, 10_000),)))
    capacity = replica_capacity(learned, served, lambda floor: target_ttft_p99_ms(
        spec.autoscaling, spec.slo.ttft_p99_ms, floor), spec.engine.max_input_len, CATALOG)
    return replace(fleet, engine=replace(fleet.engine, profile=replace(profile, **slow)), capacity=capacity)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[round(0.99 * (len(ordered) - 1))]


def ttft_p99_after_each_scale_down(run: FleetRun) -> list[float]:
    """The p99 TTFT of the requests arriving from each scale-down until the next change (or the
    end): what the replicas left served."""
    found = []
    for index, event in enumerate(run.scaling):
        if event.decision != ScalingDecision.SCALE_DOWN:
            continue
        until_s = run.scaling[index + 1].time_s if index + 1 < len(run.scaling) else run.end_s
        found.append(p99([r.ttft_ms for r in run.requests if r.failure is None
                          and event.time_s <= r.arrival.arrival_ms / 1000 < until_s]))
    return found


def within_slo(run: FleetRun, slo_ms: float) -> float:
    return sum(r.failure is None and r.ttft_ms <= slo_ms for r in run.requests) / len(run.requests)


@pytest.mark.parametrize("seed", [0, 3])
def test_the_demos_load_scales_down_without_a_breach_or_a_reversal(seed):
    spec = demo_spec()
    served = plan(plan_request_from_spec(spec, catalog=CATALOG), CATALOG)
    run = simulate(fleet_for(spec, served, CATALOG), settings_for(spec, seed),
                   arrivals(DEMO_LOAD_ARGS, seed, DEMO_EXTENDED_S))
    after = ttft_p99_after_each_scale_down(run)
    assert after, "the fleet never scaled down"
    assert max(after) <= spec.slo.ttft_p99_ms
    assert run.reversals() == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_on_an_engine_slower_than_the_model_the_learned_speed_keeps_what_the_rate_needs(seed):
    spec = demo_spec()
    served = plan(plan_request_from_spec(spec, catalog=CATALOG), CATALOG)
    aware = slower(fleet_for(spec, served, CATALOG), spec, served, SANDBOX_SPEED)
    load = arrivals(DEMO_LOAD_ARGS, seed, DEMO_EXTENDED_S)
    run = simulate(aware, settings_for(spec, seed), load)
    after = ttft_p99_after_each_scale_down(run)
    assert after, "the fleet never scaled down"
    assert max(after) <= spec.slo.ttft_p99_ms
    assert run.reversals() == 0
    # 1 request/s at the learned speed needs two replicas: the fleet ends with two.
    assert run.replicas_at(run.end_s - 1)[1] == 2
    # Blind to capacity, the p99 rule keeps the whole fleet to the end: the slower engine's p99
    # never falls under half the target.
    blind = simulate(replace(aware, capacity=None), settings_for(spec, seed), load)
    assert blind.replicas_at(blind.end_s - 1)[1] == spec.autoscaling.max_replicas
    assert not ttft_p99_after_each_scale_down(blind)


# A known miss (issue 30 part 5): with connections spread at random, as kube-proxy's default
# mode does, two long prompts often land on one replica; the model's p99 misses that queueing
# tail, calls the breach prefill-bound, and at seed 2 the replicas it did not add would have
# served 1.4 points more requests within the SLO (97.6 % against 99.0 %).
RANDOM_TAIL_MISS = pytest.mark.xfail(strict=True, reason="the model's p99 misses the queueing tail of long "
                                     "prompts landing together under random routing (issue 30 part 5)")


@pytest.mark.parametrize(("routing", "seed"), [(ROUND_ROBIN, 1), (ROUND_ROBIN, 2), (RANDOM, 1),
                                               pytest.param(RANDOM, 2, marks=RANDOM_TAIL_MISS)])
def test_a_prefill_bound_p99_gets_no_replicas_that_cannot_help(routing, seed, monkeypatch):
    spec = long_prompt_spec()
    served = plan(plan_request_from_spec(spec, catalog=CATALOG), CATALOG)
    load = arrivals(("--schedule", "0.8", "--duration-s", "600", "--input-tokens", "lognormal:3000:9000",
                     "--output-tokens", "lognormal:128:256"), seed)
    signals = collections.Counter()
    decide = simulation_fleet.decide

    def counted(*args, **kwargs):
        decision = decide(*args, **kwargs)
        signals[decision.signal] += 1
        return decision
    monkeypatch.setattr(simulation_fleet, "decide", counted)
    fleet = fleet_for(spec, served, CATALOG)
    run = simulate(fleet, settings_for(spec, seed, routing), load)
    assert signals[ScalingSignal.PREFILL_BOUND] > 0
    assert run.peak_replicas() <= 2  # 0.8 request/s needs two at the model's capacity
    blind = simulate(replace(fleet, capacity=None), settings_for(spec, seed, routing), load)
    assert blind.peak_replicas() == spec.autoscaling.max_replicas
    assert run.replica_seconds() < 0.6 * blind.replica_seconds()
    # The replicas it did not add would not have served more requests within the SLO.
    assert within_slo(run, spec.slo.ttft_p99_ms) >= within_slo(blind, spec.slo.ttft_p99_ms) - 0.005
