"""The p99-TTFT scaling policy: a table per branch, then properties over random inputs."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.api import AutoscalingSpec
from llmfleet.api.status import AutoscalerStatus, ScalingDecision
from llmfleet.autoscale import (
    MAX_RECOMMENDATIONS,
    AutoscalerState,
    MetricsFailure,
    MetricsSnapshot,
    Recommendation,
    ReplicaCapacity,
    ReplicaObservation,
    decide,
    forecast_requests_per_second,
    target_ttft_p99_ms,
)
from llmfleet.autoscale.capacity import carried_requests_per_second, replicas_for_rate
from llmfleet.autoscale.policy import DEFAULT_TUNING, stale_after_seconds
from llmfleet.autoscale.state import in_force, record

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
SLO_MS = 500
UP, DOWN, HOLD = ScalingDecision.SCALE_UP, ScalingDecision.SCALE_DOWN, ScalingDecision.HOLD
# Quick scaling, steering to the SLO itself, so that the tables isolate one rule at a time.
SPEC = AutoscalingSpec(enabled=True, min_replicas=1, max_replicas=8, target_ttft_p99_ms=SLO_MS,
                       tolerance_percent=10,
                       scale_down_stabilization_seconds=0, max_scale_up_step=4,
                       max_scale_down_step=1, cooldown_seconds=0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fresh(now: datetime = T0, **observed) -> MetricsSnapshot:
    """A healthy, quiet fleet two seconds ago, scraped every 5 s, with `observed` overriding fields."""
    values = dict(ttft_p99_ms=300.0, waiting_requests=0.0, waiting_growth_per_second=0.0,
                  kv_cache_utilization=0.3, requests_per_second=10.0,
                  sample_time=now - timedelta(seconds=2), scrape_interval_seconds=5.0, window_seconds=30)
    return MetricsSnapshot(**{**values, **observed})


def run(snapshot: MetricsSnapshot, current: int = 2, ready: int | None = None,
        state: AutoscalerState = AutoscalerState(), now: datetime = T0, spec=SPEC, **spec_changes):
    spec = spec.model_copy(update=spec_changes) if spec_changes else spec
    return decide(spec, SLO_MS, snapshot, state, current, current if ready is None else ready, now)


# --- target and tolerance band ---------------------------------------------------------------

@pytest.mark.parametrize("spec_target, expected", [(None, 300), (400, 400), (800, 500)])
def test_target_is_the_spec_target_or_60_percent_of_the_slo_capped_by_the_slo(spec_target, expected):
    assert target_ttft_p99_ms(SPEC.model_copy(update={"target_ttft_p99_ms": spec_target}),
                              SLO_MS) == expected


@pytest.mark.parametrize("ttft_ms, desired, decision, words", [
    (550.0, 2, HOLD, "within 10% of the 500 ms target"),
    (450.0, 2, HOLD, "within 10%"),
    (551.0, 3, UP, "scaling up from 2 to 3"),
    (449.0, 2, HOLD, "not under 50% of the 500 ms target"),
    (249.0, 1, DOWN, "under 50% of the 500 ms target and no request waits"),
])
def test_tolerance_band(ttft_ms, desired, decision, words):
    result = run(fresh(ttft_p99_ms=ttft_ms))
    assert (result.desired_replicas, result.decision) == (desired, decision)
    assert words in result.reason
    assert result.metrics_available


def test_a_tighter_spec_target_is_what_counts():
    result = run(fresh(ttft_p99_ms=400.0), target_ttft_p99_ms=300)
    assert result.desired_replicas == 3 and "300 ms target" in result.reason
    assert result.inputs.target_ttft_p99_ms == 300


# --- scale-up in proportion to the breach and to queue growth -------------------------------

@pytest.mark.parametrize("current, ttft_ms, desired, words", [
    (2, 560.0, 3, "from 2 to 3 replicas"),  # 2 x 1.12 = 2.24 -> 3
    (2, 750.0, 3, "x1.50"),  # 2 x 1.5 = 3 exactly
    (2, 1000.0, 4, "from 2 to 4 replicas"),
    (1, 600.0, 2, "from 1 to 2"),  # at least one more
    (3, 1000.0, 6, "from 3 to 6 replicas"),
    (2, 5000.0, 6, "(maxScaleUpStep 4)"),  # 20 wanted, 4 more at most
    (6, 5000.0, 8, "(maxReplicas 8)"),
    (8, 5000.0, 8, "holding 8 replicas: maxReplicas is 8"),
])
def test_scale_up_is_proportional_to_the_breach_within_limits(current, ttft_ms, desired, words):
    result = run(fresh(ttft_p99_ms=ttft_ms), current=current)
    assert result.desired_replicas == desired
    assert result.decision == (UP if desired > current else HOLD)
    assert words in result.reason


def test_proportional_scaling_has_no_float_error():
    result = run(fresh(ttft_p99_ms=250.0), current=11, max_replicas=40, max_scale_up_step=20,
                 target_ttft_p99_ms=110)
    assert 11 * (250.0 / 110) > 25  # 25 exactly, but the float product is just over
    assert result.desired_replicas == 25


@pytest.mark.parametrize("waiting, growth, served, ttft_ms, desired", [
    (10.0, 5.0, 10.0, 300.0, 3),  # arrivals 15/s against 10/s served: x1.5
    (10.0, 5.0, 10.0, 1000.0, 4),  # the breach (x2) is the larger signal
    (10.0, 0.5, 10.0, 300.0, 2),  # x1.05 is inside the tolerance band
    (1.0, 5.0, 10.0, 300.0, 2),  # under one waiting request per replica: noise
    (10.0, -5.0, 10.0, 300.0, 2),  # a shrinking queue asks for nothing
    (10.0, 5.0, None, 300.0, 2),  # no served rate: growth cannot be weighed
])
def test_queue_growth_scales_up_before_ttft_breaches(waiting, growth, served, ttft_ms, desired):
    snapshot = fresh(ttft_p99_ms=ttft_ms, waiting_requests=waiting,
                     waiting_growth_per_second=growth, requests_per_second=served)
    result = run(snapshot)
    assert result.desired_replicas == desired
    if desired == 3:
        assert "the queue grows by 5.0 requests/s at 10.0 served/s (x1.50)" in result.reason


# --- scale-down: well under target, empty queue, KV headroom, minReplicas -------------------

@pytest.mark.parametrize("current, observed, desired, words", [
    (4, dict(kv_cache_utilization=None), 3, "from 4 to 3"),  # unknown KV: one fewer
    (4, dict(kv_cache_utilization=0.1), 3, "(maxScaleDownStep 1)"),  # 1 would do, 1 step
    (4, dict(kv_cache_utilization=0.6), 4, "KV cache use 60% would exceed 70%"),
    # Full batches with an empty cache: the busier resource decides.
    (4, dict(kv_cache_utilization=0.05, batch_utilization=0.6), 4, "batch slot use 60% would exceed 70%"),
    (4, dict(kv_cache_utilization=None, batch_utilization=0.1), 3, "batch slot use 10%"),
    (4, dict(waiting_requests=1.0), 4, "not under 50% of the 500 ms target with an empty queue"),
    # A release without a waiting count: unknown KV or batch use leaves the queue unknown,
    # which is not empty; both well under the ceiling mean nothing can wait.
    (4, dict(waiting_requests=None), 4, "not under 50%"),
    (4, dict(waiting_requests=None, kv_cache_utilization=0.2, batch_utilization=0.8), 4, "not under 50%"),
    (4, dict(waiting_requests=None, kv_cache_utilization=0.2, batch_utilization=0.2), 3,
     "KV cache and batch slots are under 70% in use, so none waits"),
    (1, {}, 1, "already at minReplicas 1"),
])
def test_scale_down_needs_headroom(current, observed, desired, words):
    result = run(fresh(ttft_p99_ms=100.0, **observed), current=current)
    assert result.desired_replicas == desired and words in result.reason


def test_kv_sizing_allows_larger_steps_when_configured():
    result = run(fresh(ttft_p99_ms=100.0, kv_cache_utilization=0.1), current=6,
                 max_scale_down_step=4)
    assert result.desired_replicas == 2  # ceil(6 x 0.1 / 0.7) = 1, four steps at most
    assert run(fresh(ttft_p99_ms=100.0, kv_cache_utilization=0.1), current=3, min_replicas=2,
               max_scale_down_step=4).desired_replicas == 2


def test_a_queue_growing_against_a_vanishing_served_rate_still_gives_a_bounded_step():
    # Hypothesis found it: (served + growth) / served overflows to infinity.
    result = run(fresh(ttft_p99_ms=None, waiting_requests=40.0, waiting_growth_per_second=1.0,
                       requests_per_second=2.2250738585e-313), current=2)
    assert result.desired_replicas == 2 + SPEC.max_scale_up_step


def test_an_idle_fleet_scales_down_to_the_minimum():
    idle = fresh(ttft_p99_ms=None, requests_per_second=0.0, waiting_requests=0.0,
                 kv_cache_utilization=0.0)
    result = run(idle, current=4, max_scale_down_step=8)
    assert result.metrics_available
    assert (result.desired_replicas, result.decision) == (1, DOWN)
    assert "no request in the window and no request waits" in result.reason


def test_without_queue_metrics_p99_ttft_alone_decides():
    # The llmapi runtime's model exports no queue, KV-cache or batch series.
    blind = dict(waiting_requests=None, waiting_growth_per_second=None, kv_cache_utilization=None,
                 batch_utilization=None, queue_observable=False)
    down = run(fresh(ttft_p99_ms=100.0, **blind), current=4)
    assert down.desired_replicas == 3 and "p99 TTFT alone decides" in down.reason
    assert run(fresh(ttft_p99_ms=300.0, **blind), current=4).desired_replicas == 4
    assert run(fresh(ttft_p99_ms=100.0, **{**blind, "queue_observable": True}), current=4).desired_replicas == 4


def test_an_idle_fleet_scales_down_without_a_waiting_count():
    idle = fresh(ttft_p99_ms=None, requests_per_second=0.0, waiting_requests=None,
                 waiting_growth_per_second=None, kv_cache_utilization=0.0, batch_utilization=0.0)
    result = run(idle, current=4, max_scale_down_step=8)
    assert (result.desired_replicas, result.decision) == (1, DOWN)
    assert "so none waits" in result.reason


# --- stabilisation windows -------------------------------------------------------------------

def _simulate(snapshots_by_second, spec: AutoscalingSpec, current: int, until: int,
              step: int = 15) -> list[tuple[int, int]]:
    """Passes every `step` s, applying each decision; returns (time, replicas) per change."""
    state, changes = AutoscalerState(), []
    for second in range(0, until + 1, step):
        now = at(second)
        result = decide(spec, SLO_MS, snapshots_by_second(second, now), state, current, current,
                        now)
        if result.desired_replicas != current:
            changes.append((second, result.desired_replicas))
        state, current = result.state, result.desired_replicas
    return changes


def test_scale_down_waits_for_a_full_window_of_low_recommendations():
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 300,
                                   "cooldown_seconds": 120})
    changes = _simulate(lambda second, now: fresh(now, ttft_p99_ms=100.0, kv_cache_utilization=None),
                        spec, current=4, until=960)
    # No history at start: the first step waits for 300 s of low recommendations. At 3
    # replicas, 2 is first recommended at 315 s; 3 stays in the window until 615 s.
    assert changes == [(300, 3), (615, 2), (930, 1)]


def test_one_busy_moment_in_the_window_blocks_scale_down():
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 300})

    def busy_at_240(second, now):
        return fresh(now, ttft_p99_ms=480.0 if second == 240 else 100.0, kv_cache_utilization=None)

    # 4 recommended at 240 s, 3 again from 255 s: 300 s later.
    assert _simulate(busy_at_240, spec, current=4, until=600)[0] == (555, 3)


def test_the_holding_reason_names_the_window():
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 300})
    result = decide(spec, SLO_MS, fresh(ttft_p99_ms=100.0, kv_cache_utilization=None),
                    AutoscalerState(), 4, 4, T0)
    assert result.decision == HOLD
    assert "until 3 or fewer is recommended throughout the 300 s stabilisation window" in result.reason


def test_scale_down_takes_the_highest_recommendation_in_the_window():
    state = AutoscalerState(recommendations=(Recommendation(at(0), 4), Recommendation(at(100), 2),
                                             Recommendation(at(200), 3)))
    result = run(fresh(at(400), ttft_p99_ms=100.0, kv_cache_utilization=0.01), current=4,
                 state=state, now=at(400), scale_down_stabilization_seconds=300,
                 max_scale_down_step=4)
    # In force during [100, 400]: 2, 3 and now 1: the highest is 3.
    assert result.desired_replicas == 3
    assert "(highest over the 300 s window)" in result.reason


def test_scale_up_stabilisation_takes_the_lowest_recommendation_in_the_window():
    spec = SPEC.model_copy(update={"scale_up_stabilization_seconds": 60})
    changes = _simulate(lambda second, now: fresh(now, ttft_p99_ms=1000.0 if second < 30 else 600.0),
                        spec, current=2, until=150)
    # 4 wanted at 0 and 15 s, 3 from 30 s: at 60 s the window is covered and its lowest is 3.
    # At 3 replicas 4 is wanted (3 x 1.2) from 75 s, so 60 s later.
    assert changes == [(60, 3), (135, 4)]


# --- cooldown and warming replicas -----------------------------------------------------------

@pytest.mark.parametrize("seconds_since_change, desired, words", [
    (60, 4, "holding 4 replicas for the cooldown, 60 s left"),
    (120, 3, "from 4 to 3"),
])
def test_cooldown_holds_a_scale_down_after_any_change(seconds_since_change, desired, words):
    state = AutoscalerState(last_scale_time=at(0))
    result = run(fresh(at(seconds_since_change), ttft_p99_ms=100.0, kv_cache_utilization=None),
                 current=4, state=state, now=at(seconds_since_change), cooldown_seconds=120)
    assert result.desired_replicas == desired and words in result.reason
    assert result.state.last_scale_time == (at(0) if desired == 4 else at(seconds_since_change))


def test_cooldown_never_holds_a_scale_up():
    state = AutoscalerState(last_scale_time=at(0))
    result = run(fresh(at(10), ttft_p99_ms=1000.0), state=state, now=at(10), cooldown_seconds=120)
    assert result.desired_replicas == 4 and "from 2 to 4" in result.reason


@pytest.mark.parametrize("ready, warming_since, desired, words", [
    (2, 30, 4, "holding 4 replicas while 2 warm up (for at most 600 s)"),
    (2, None, 4, "while 2 warm up"),  # first seen warming now
    (2, -601, 8, "from 4 to 8"),  # warm-up timeout passed
    (4, 30, 8, "from 4 to 8"),  # all ready
])
def test_warming_replicas_block_further_scale_up(ready, warming_since, desired, words):
    now = at(60)
    state = AutoscalerState(warming_since=None if warming_since is None else at(warming_since))
    result = run(fresh(now, ttft_p99_ms=1500.0), current=4, ready=ready, state=state, now=now)
    assert result.desired_replicas == desired and words in result.reason


def test_a_slow_engine_start_does_not_cascade():
    """A breach lasting through a 5 min engine load adds replicas once, based on the desired
    count (not the ready one), and again only once the new replicas are ready."""
    state, current, ready, changes = AutoscalerState(), 2, 2, []
    for second in range(0, 600, 15):
        if changes and second >= changes[-1][0] + 300:
            ready = current  # the engines finished loading
        result = decide(SPEC, SLO_MS, fresh(at(second), ttft_p99_ms=1000.0), state, current,
                        ready, at(second))
        if result.desired_replicas != current:
            changes.append((second, result.desired_replicas))
        state, current = result.state, result.desired_replicas
    assert changes == [(0, 4), (300, 8)]


def test_warming_does_not_block_scale_down():
    result = run(fresh(ttft_p99_ms=100.0, kv_cache_utilization=None), current=4, ready=2)
    assert result.desired_replicas == 3


@pytest.mark.parametrize("current, ready, previous, expected", [
    (4, 4, at(0), None),  # all ready
    (4, 3, at(0), at(0)),  # still warming since then
    (4, 3, None, at(60)),  # first seen now
])
def test_warming_since_is_remembered(current, ready, previous, expected):
    result = run(fresh(at(60)), current=current, ready=ready, now=at(60),
                 state=AutoscalerState(warming_since=previous))
    assert result.state.warming_since == expected


def test_a_scale_up_starts_the_warm_up_clock():
    assert run(fresh(at(60), ttft_p99_ms=1000.0), now=at(60)).state.warming_since == at(60)


# --- missing, empty, stale or failed metrics -------------------------------------------------

@pytest.mark.parametrize("snapshot, reason, words", [
    (MetricsSnapshot(error="ttft_p99_ms: ConnectionError: refused"), "PrometheusError",
     "Prometheus query failed: ttft_p99_ms: ConnectionError: refused"),
    (MetricsSnapshot(), "NoData", "no samples from the serving pods"),
    (fresh(ttft_p99_ms=100.0, sample_time=T0 - timedelta(seconds=16)), "StaleData",
     "the newest sample is 16 s old (limit 15 s, 3 scrape intervals of 5 s)"),
    (fresh(sample_time=T0 - timedelta(seconds=91), scrape_interval_seconds=30.0), "StaleData",
     "the newest sample is 91 s old (limit 90 s, 3 scrape intervals of 30 s)"),
    (fresh(scrape_interval_seconds=None), "NoData", "the scrape interval is unknown"),
    (fresh(ttft_p99_ms=2000.0, sample_time=T0 - timedelta(seconds=60)), "StaleData", "60 s old"),
    (fresh(ttft_p99_ms=None, requests_per_second=5.0), "NoTtftData", "no request got a first token"),
    (fresh(ttft_p99_ms=None, requests_per_second=None, waiting_requests=None), "NoTtftData",
     "below the backlog threshold"),
])
@pytest.mark.parametrize("current", [1, 4, 8])
def test_without_trustworthy_metrics_hold(snapshot, reason, words, current):
    result = run(snapshot, current=current, max_scale_down_step=8)
    assert (result.desired_replicas, result.decision) == (current, HOLD)
    assert not result.metrics_available
    assert result.metrics_reason == reason and words in result.metrics_message
    assert result.reason == f"holding {current} replicas: {result.metrics_message}"


@pytest.mark.parametrize("interval_s", [5.0, 15.0, 30.0, 60.0])
def test_a_sample_exactly_at_the_staleness_limit_is_fresh(interval_s):
    limit_s = stale_after_seconds(interval_s)
    assert limit_s == 3 * interval_s
    result = run(fresh(sample_time=T0 - timedelta(seconds=limit_s), scrape_interval_seconds=interval_s))
    assert result.metrics_available and result.metrics_reason == "MetricsFresh"
    assert result.metrics_message == (f"Prometheus answers; newest sample {limit_s:.0f} s old "
                                      f"(scrape interval {interval_s:g} s, 30 s window)")
    late = run(fresh(sample_time=T0 - timedelta(seconds=limit_s + 1), scrape_interval_seconds=interval_s))
    assert late.metrics_reason == "StaleData"


@pytest.mark.parametrize("reason", ["PrometheusUnauthorized", "PrometheusTlsError"])
def test_a_failure_of_a_known_kind_is_the_conditions_reason(reason):
    result = run(MetricsSnapshot(error="401", error_reason=MetricsFailure(reason)))
    assert (result.metrics_available, result.metrics_reason) == (False, reason)


def test_a_sample_from_slightly_ahead_counts_as_fresh():
    assert run(fresh(sample_time=T0 + timedelta(seconds=3))).metrics_available


QUIET = dict(ttft_p99_ms=100.0, kv_cache_utilization=0.1)


@pytest.mark.parametrize("reporting_pods, desired", [(1, 2), (2, 1), (3, 1), (None, 1)])
def test_metrics_from_fewer_pods_than_ready_replicas_hold_a_scale_down(reporting_pods, desired):
    """A replica Prometheus lost takes its queue and load out of the sums: a quiet fleet may
    only look quiet."""
    result = run(fresh(**QUIET, reporting_pods=reporting_pods), current=2)
    assert result.desired_replicas == desired
    assert result.metrics_available == (desired == 1)
    if desired == 2:
        assert result.metrics_reason == "PartialData"
        assert result.metrics_message == ("only 1 of 2 ready replicas report metrics to Prometheus; "
                                          "scaling down waits until all do")
        assert result.reason.endswith(f"but {result.metrics_message}: holding 2 replicas")


def test_metrics_from_fewer_pods_than_ready_replicas_still_scale_up():
    result = run(fresh(ttft_p99_ms=1000.0, reporting_pods=1), current=2)
    assert (result.desired_replicas, result.decision) == (4, UP)
    assert result.metrics_available and result.metrics_reason == "MetricsFresh"


# --- where requests land ----------------------------------------------------------------------

def replica(pod: str, ttft_p99_ms: float | None, requests_per_second: float = 2.0) -> ReplicaObservation:
    return ReplicaObservation(pod, ttft_p99_ms, requests_per_second)


@pytest.mark.parametrize("replicas, imbalanced", [
    # One swamped replica, the others idle (no first token in the window) or far under target.
    ((replica("a", 90_000.0), replica("b", None, 0.0), replica("c", 40.0)), True),
    ((replica("a", 2_000.0), replica("b", 249.0)), True),
    # Every replica breaches, or the others are busy too: short of capacity.
    ((replica("a", 2_000.0), replica("b", 900.0)), False),
    ((replica("a", 2_000.0), replica("b", 250.0)), False),
    # A replica with no data (not yet scraped) says nothing either way.
    ((replica("a", 2_000.0), replica("b", None, None)), False),
    ((), False),
])
def test_a_breach_at_some_replicas_while_others_idle_is_routing_not_capacity(replicas, imbalanced):
    result = run(fresh(ttft_p99_ms=1_000.0, replicas=replicas), current=len(replicas) or 2)
    assert (result.imbalance is not None) == imbalanced
    if imbalanced:
        assert result.decision == HOLD and result.desired_replicas == len(replicas)
        assert "requests pile up at 1 of" in result.imbalance and "more replicas would not help" in result.reason
        assert f"a (p99 TTFT {replicas[0].ttft_p99_ms:.0f} ms)" in result.imbalance
    else:
        assert result.decision == UP


def test_an_imbalance_message_names_a_few_replicas_and_counts_the_rest():
    idle = tuple(replica(f"idle-{n}", None, 0.0) for n in range(5))
    result = run(fresh(ttft_p99_ms=1_000.0, replicas=(replica("hot", 5_000.0), *idle)), current=6)
    assert "5 are idle or under 250 ms" in result.imbalance
    assert "idle-0 (idle), idle-1 (idle), idle-2 (idle) and 2 more" in result.imbalance


def test_a_p99_at_the_histograms_top_edge_reads_as_over():
    """Beyond the top bucket Prometheus answers the bucket's edge: a lower bound, said so."""
    result = run(fresh(ttft_p99_ms=300_000.0, ttft_histogram_top_ms=300_000.0))
    assert "p99 TTFT over 300000 ms against a 500 ms target" in result.reason
    below = run(fresh(ttft_p99_ms=120_000.0, ttft_histogram_top_ms=300_000.0))
    assert "p99 TTFT 120000 ms against" in below.reason


@pytest.mark.parametrize("waiting, desired", [(8.0, 3), (7.0, 2)])
def test_a_backlog_scales_up_without_ttft_data(waiting, desired):
    """A stalled fleet gets no first tokens, so no TTFT: a large queue is enough to add one."""
    result = run(fresh(ttft_p99_ms=None, requests_per_second=0.0, waiting_requests=waiting))
    assert result.desired_replicas == desired
    assert result.metrics_available == (desired == 3)
    if desired == 3:
        assert "no request got a first token in the window but 8 wait (4.0 per replica)" in result.reason


def test_metrics_recover_by_themselves():
    state, current = AutoscalerState(), 2
    outage = run(MetricsSnapshot(error="refused"), current=current, state=state)
    assert not outage.metrics_available and outage.desired_replicas == 2
    recovered = run(fresh(at(15), ttft_p99_ms=1000.0), state=outage.state, now=at(15))
    assert recovered.metrics_available and recovered.desired_replicas == 4


def test_an_outage_counts_as_no_evidence_for_scaling_down():
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 300})

    def outage_then_quiet(second, now):
        return MetricsSnapshot(error="refused") if second < 600 else fresh(now, ttft_p99_ms=100.0,
                                                                       kv_cache_utilization=None)

    assert _simulate(outage_then_quiet, spec, current=4, until=1200)[0] == (900, 3)


# --- replica bounds --------------------------------------------------------------------------

@pytest.mark.parametrize("snapshot", [fresh(), MetricsSnapshot(error="refused")])
@pytest.mark.parametrize("current, desired", [(10, 8), (0, 1)])
def test_counts_outside_the_bounds_are_corrected_at_once(snapshot, current, desired):
    state = AutoscalerState(last_scale_time=T0)  # not even the cooldown waits
    result = run(snapshot, current=current, state=state, cooldown_seconds=120)
    assert result.desired_replicas == desired
    assert f"outside minReplicas 1..maxReplicas 8: scaling to {desired}" in result.reason


def test_a_recommendation_from_an_old_lower_minimum_holds_at_the_new_one():
    state = AutoscalerState(recommendations=(Recommendation(at(-600), 1),))
    result = run(fresh(ttft_p99_ms=450.0), current=3, min_replicas=3, state=state,
                 scale_down_stabilization_seconds=300)
    assert result.desired_replicas == 3


# --- recommendation history ------------------------------------------------------------------

def test_history_keeps_only_changes_still_in_force():
    history = ()
    for second, replicas in [(0, 2), (15, 2), (30, 3), (45, 3), (400, 2)]:
        history = record(history, Recommendation(at(second), replicas), keep_seconds=300)
    # 2 from 0 s ended at 30 s, before the horizon (100 s): dropped. 3 is in force at it.
    assert history == (Recommendation(at(30), 3), Recommendation(at(400), 2))
    assert in_force(history, 300, at(400)) == ([3, 2], True)
    assert in_force(history, 0, at(400)) == ([2], True)
    assert in_force(history, 500, at(400)) == ([3, 2], False)


def test_history_is_bounded():
    history = ()
    for second in range(0, 3000, 15):
        history = record(history, Recommendation(at(second), 1 + second // 15 % 2), 3600)
    assert len(history) == MAX_RECOMMENDATIONS


def test_the_decision_fits_the_status_model():
    result = run(fresh(ttft_p99_ms=1000.0, kv_cache_utilization=1.02))
    status = AutoscalerStatus(desired_replicas=result.desired_replicas,
                              last_decision=result.decision, last_decision_time=T0,
                              reason=result.reason, inputs=result.inputs)
    assert status.inputs.kv_cache_utilization_percent == 100.0
    assert status.inputs.observed_ttft_p99_ms == 1000.0
    for snapshot in (MetricsSnapshot(error="x"), MetricsSnapshot(), fresh(),
                     fresh(sample_time=T0 - timedelta(hours=1)), fresh(ttft_p99_ms=None)):
        # Condition reasons are CamelCase (metav1.Condition's pattern).
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", run(snapshot).metrics_reason)


def test_state_survives_second_precision_persistence():
    """status keeps times to the second (KubeTime): truncation must not change decisions."""
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 300})
    state, current = AutoscalerState(), 4
    for second in range(0, 330, 15):
        now = at(second + 0.7)
        result = decide(spec, SLO_MS, fresh(now, ttft_p99_ms=100.0, kv_cache_utilization=None),
                        state, current, current, now)
        state = AutoscalerState(
            last_scale_time=result.state.last_scale_time and
            result.state.last_scale_time.replace(microsecond=0),
            warming_since=None,
            recommendations=tuple(Recommendation(r.time.replace(microsecond=0), r.replicas)
                                  for r in result.state.recommendations))
        current = result.desired_replicas
    assert current == 3


# --- properties ------------------------------------------------------------------------------

@st.composite
def specs(draw):
    minimum = draw(st.integers(1, 6))
    return AutoscalingSpec(
        enabled=True, min_replicas=minimum, max_replicas=draw(st.integers(minimum, 12)),
        target_ttft_p99_ms=draw(st.none() | st.integers(50, 2000)),
        tolerance_percent=draw(st.floats(0, 50)),
        scale_up_stabilization_seconds=draw(st.sampled_from([0, 30, 120])),
        scale_down_stabilization_seconds=draw(st.sampled_from([0, 60, 300])),
        max_scale_up_step=draw(st.integers(1, 6)), max_scale_down_step=draw(st.integers(1, 4)),
        cooldown_seconds=draw(st.sampled_from([0, 60, 120])))


optional_float = st.none() | st.floats(0, 1e4, allow_nan=False)


@st.composite
def snapshots(draw):
    return MetricsSnapshot(
        ttft_p99_ms=draw(optional_float), waiting_requests=draw(optional_float),
        waiting_growth_per_second=draw(st.none() | st.floats(-100, 100)),
        kv_cache_utilization=draw(st.none() | st.floats(0, 1)),
        requests_per_second=draw(optional_float),
        requests_per_second_peak=draw(optional_float),
        requests_per_second_trend=draw(st.none() | st.floats(-10, 10)),
        sample_time=draw(st.none() | st.builds(lambda age: T0 - timedelta(seconds=age),
                                               st.floats(-5, 120))),
        reporting_pods=draw(st.none() | st.integers(0, 12)),
        scrape_interval_seconds=draw(st.sampled_from([None, 5.0, 15.0, 30.0, 60.0])),
        error=draw(st.none() | st.just("refused")))


@st.composite
def states(draw):
    times = draw(st.lists(st.integers(-4000, 0), max_size=8, unique=True).map(sorted))
    return AutoscalerState(
        last_scale_time=draw(st.none() | st.integers(-600, 0).map(at)),
        warming_since=draw(st.none() | st.integers(-900, 0).map(at)),
        recommendations=tuple(Recommendation(at(t), draw(st.integers(1, 12))) for t in times))


@st.composite
def capacities(draw):
    floor = draw(st.floats(1, 2000))
    slope = draw(st.floats(0, 1e4))
    return ReplicaCapacity(draw(st.integers(1, 2000)), draw(st.none() | st.floats(0.01, 100)), floor,
                           floor + draw(st.floats(0, 5000)), lambda rate: floor + slope * rate ** 2)


@st.composite
def passes(draw):
    spec = draw(specs())
    current = draw(st.integers(spec.min_replicas, spec.max_replicas))
    return (spec, draw(snapshots()), draw(states()), current, draw(st.integers(0, current)),
            draw(st.none() | capacities()))


@settings(max_examples=400, deadline=None)
@given(passes())
def test_properties_of_every_decision(case):
    spec, snapshot, state, current, ready, capacity = case
    result = decide(spec, SLO_MS, snapshot, state, current, ready, T0, DEFAULT_TUNING, capacity)
    desired = result.desired_replicas
    assert spec.min_replicas <= desired <= spec.max_replicas
    assert desired - current <= spec.max_scale_up_step
    assert current - desired <= spec.max_scale_down_step
    if not result.metrics_available:
        assert desired == current  # never scale, least of all down, without metrics
    if desired < current:
        assert snapshot.reporting_pods is None or snapshot.reporting_pods >= ready
    assert result.decision == (UP if desired > current else DOWN if desired < current else HOLD)
    assert len(result.reason) <= 1024
    assert len(result.state.recommendations) <= MAX_RECOMMENDATIONS
    assert result.state.recommendations[-1].time <= T0
    if desired < current and capacity is not None and capacity.requests_per_second is not None:
        # What is left carries the window's peak rate (and the forecast) at the modelled capacity.
        peak = max(snapshot.requests_per_second or 0, snapshot.requests_per_second_peak or 0,
                   forecast_requests_per_second(spec, snapshot) or 0)
        per_replica = carried_requests_per_second(snapshot, result.inputs.target_ttft_p99_ms, current, capacity)
        assert replicas_for_rate(peak, per_replica) <= desired
    assert result.state.reversals == state.reversals + result.reversal


@settings(max_examples=100, deadline=None)
@given(specs(), st.lists(snapshots(), min_size=1, max_size=30), st.integers(0, 11))
def test_properties_over_a_run_of_passes(spec, run_snapshots, start):
    current = min(max(start, spec.min_replicas), spec.max_replicas)
    state = AutoscalerState()
    for index, snapshot in enumerate(run_snapshots):
        now = at(15 * index)
        if snapshot.sample_time is not None:  # keep the drawn age at this pass
            snapshot = dataclasses.replace(snapshot, sample_time=now - (T0 - snapshot.sample_time))
        result = decide(spec, SLO_MS, snapshot, state, current, current, now)
        assert spec.min_replicas <= result.desired_replicas <= spec.max_replicas
        if result.desired_replicas < current and state.last_scale_time is not None:
            assert (now - state.last_scale_time).total_seconds() >= spec.cooldown_seconds
        state, current = result.state, result.desired_replicas
