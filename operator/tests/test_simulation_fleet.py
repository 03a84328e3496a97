"""The fleet simulator's replica timeline, routing and Prometheus view against hand-computed
small cases: an engine whose every step takes 10 ms, one sequence at a time, so that a request
of N output tokens holds its replica for N x 10 ms."""

from __future__ import annotations

import pytest

from llmfleet.api import AutoscalingSpec
from llmfleet.api.status import ScalingDecision
from llmfleet.simulation.fleet import Engine, Fleet, FleetSettings, ReplicaSpan, _Simulation, simulate
from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.fleet import EPOCH
from llmfleet.simulation.prometheus_view import (
    PodSeries, Sample, ScrapeSettings, extrapolated_rate, histogram_quantile, least_squares_slope, snapshot)
from llmfleet.simulation.replica import Arrival
from llmfleet.simulation.routing import LEAST_CONNECTIONS, RANDOM, ROUND_ROBIN

STEP_MS = 10.0
PROFILE = EngineProfile(
    gpu_type="H100-SXM-80GB", tensor_parallel_size=1, quantization="BF16", kv_cache_dtype="BF16",
    prefill_ms_per_token=0.0, prefill_fixed_ms=0.0, decode_step_base_ms=STEP_MS,
    decode_step_ms_per_sequence=0.0, decode_step_ms_per_kv_token=0.0,
    kv_block_tokens=16, kv_blocks_total=1000, max_batch_size=1, max_num_tokens=1000)
ENGINE = Engine(PROFILE, max_input_tokens=100, max_sequence_tokens=1000)
# Passes and scrapes every second over a 4 s window, every replica scraped just before each
# pass: decisions fall on whole seconds. Round-robin, so that each request's replica is known.
SETTINGS = FleetSettings(scrape_interval_seconds=1.0, window_seconds=4, reconcile_interval_seconds=1.0,
                         start_up_delay_seconds=1.5, scrape_phase_seconds=0.0, routing=ROUND_ROBIN)


def _autoscaling(**overrides) -> AutoscalingSpec:
    fields = dict(enabled=True, min_replicas=1, max_replicas=2, scale_up_stabilization_seconds=0,
                  scale_down_stabilization_seconds=0, cooldown_seconds=0, max_scale_up_step=1)
    return AutoscalingSpec(**{**fields, **overrides})


def test_round_robin_queues_behind_a_long_request_where_least_connections_does_not():
    # replica-0 gets the long request (10 tokens: busy until 100 ms), replica-1 the short one
    # (done at 11 ms); the third comes at 20 ms.
    arrivals = [Arrival(0.0, 10, 10), Arrival(1.0, 10, 1), Arrival(20.0, 10, 1)]
    fleet = Fleet(ENGINE, initial_replicas=2, slo_ttft_p99_ms=1000, autoscaling=None)
    round_robin = simulate(fleet, SETTINGS, arrivals)
    least = simulate(fleet, FleetSettings(**{**SETTINGS.__dict__, "routing": LEAST_CONNECTIONS}), arrivals)

    assert [r.replica for r in round_robin.requests] == ["replica-0", "replica-1", "replica-0"]
    # Round-robin: behind the long request, which ends at 100 ms; its one token at 110 ms.
    assert round_robin.requests[2].ttft_ms == pytest.approx(90.0)
    assert [r.replica for r in least.requests] == ["replica-0", "replica-1", "replica-1"]
    assert least.requests[2].ttft_ms == pytest.approx(STEP_MS)
    assert round_robin.requests[0].tpot_ms == pytest.approx(STEP_MS)
    assert least.end_s == pytest.approx(0.1)
    assert least.replica_seconds() == pytest.approx(0.2)


def test_random_routing_picks_each_replica_at_random_from_the_seed_and_leaves_the_scrape_phases_alone():
    """kube-proxy's default (iptables) mode: each connection to an endpoint drawn at random, so a
    replica can get several requests in a row while another gets none, where round-robin alternates."""
    arrivals = [Arrival(i * 1000.0, 10, 1) for i in range(200)]
    fleet = Fleet(ENGINE, initial_replicas=2, slo_ttft_p99_ms=1000, autoscaling=None)
    settings = FleetSettings(**{**SETTINGS.__dict__, "routing": RANDOM, "scrape_phase_seconds": None, "seed": 7})
    picks = [r.replica for r in simulate(fleet, settings, arrivals).requests]
    repeats = sum(a == b for a, b in zip(picks, picks[1:]))
    assert 70 <= picks.count("replica-0") <= 130, picks.count("replica-0")
    assert 70 <= repeats <= 130, repeats  # about half of consecutive picks repeat; round-robin: none
    assert [r.replica for r in simulate(fleet, settings, arrivals).requests] == picks
    other_seed = [r.replica for r in simulate(fleet, FleetSettings(**{**settings.__dict__, "seed": 8}), arrivals).requests]
    assert other_seed != picks
    # The routing stream is the seed's own: the replicas' scrape phases are those of round-robin.
    phases = [_Simulation(fleet, FleetSettings(**{**settings.__dict__, "routing": routing}), arrivals, None, 60.0)
              for routing in (RANDOM, ROUND_ROBIN)]
    for simulation in phases:
        simulation.run()
    assert [r.scrape_phase_s for r in phases[0].replicas] == [r.scrape_phase_s for r in phases[1].replicas]


def test_a_growing_queue_scales_up_at_the_first_pass_that_sees_it_and_the_new_replica_serves_after_the_delay():
    # Five requests of 100 tokens (1 s each) at 0..4 ms queue on one replica: first tokens at
    # 0.01, 1.01, 2.01, 3.01, 4.01 s. The pass at 1 s is the first with two scrapes in its
    # window: p99 TTFT 9.9 ms, but the queue went from 1 to 4 in a second while 0.25
    # requests/s were served (one first token, extrapolated over the 4 s window): x13, cut
    # to maxReplicas 2.
    arrivals = [Arrival(float(k), 10, 100) for k in range(5)] + [Arrival(4000.0, 10, 100)]
    fleet = Fleet(ENGINE, initial_replicas=1, slo_ttft_p99_ms=1000, autoscaling=_autoscaling())
    run = simulate(fleet, SETTINGS, arrivals)

    assert [(event.time_s, event.from_replicas, event.to_replicas, event.decision) for event in run.scaling] == [
        (1.0, 1, 2, ScalingDecision.SCALE_UP)]
    assert "the queue grows by 3.0 requests/s" in run.scaling[0].reason
    assert run.scaling[0].reason.endswith("scaling up from 1 to 2 replicas (maxReplicas 2)")
    # The queued requests stay where they were routed; the one at 4 s goes to the new replica
    # (round-robin's sixth pick, of the two serving), and both finish at 5 s.
    assert [r.replica for r in run.requests] == ["replica-0"] * 5 + ["replica-1"]
    assert [round(r.ttft_ms) for r in run.requests] == [10, 1009, 2008, 3007, 4006, 10]
    assert run.end_s == pytest.approx(5.0)
    assert run.replicas == (ReplicaSpan("replica-0", 0.0, 0.0, None, 5.0), ReplicaSpan("replica-1", 1.0, 2.5, None, 5.0))
    assert run.replica_seconds() == pytest.approx(9.0)
    assert run.replicas_at(2.0) == (2, 1) and run.replicas_at(3.0) == (2, 2)


def test_a_pass_between_scrapes_reads_the_older_scrape():
    # The growing queue above, scraped at 0.5, 1.5 ... s: the pass at 1 s reads the one scrape
    # at 0.5 s, too few for a rate or the queue's growth; it holds 4 waiting requests (1-4 ms
    # arrivals behind the first), and the backlog alone decides.
    arrivals = [Arrival(float(k), 10, 100) for k in range(5)] + [Arrival(4000.0, 10, 100)]
    fleet = Fleet(ENGINE, initial_replicas=1, slo_ttft_p99_ms=1000, autoscaling=_autoscaling())
    run = simulate(fleet, FleetSettings(**{**SETTINGS.__dict__, "scrape_phase_seconds": 0.5}), arrivals)

    assert [(event.time_s, event.to_replicas) for event in run.scaling] == [(1.0, 2)]
    assert run.scaling[0].reason.startswith("no request got a first token in the window but 4 wait")


def test_each_replica_is_scraped_at_its_own_phase_as_prometheus_spreads_its_targets():
    settings = FleetSettings(**{**SETTINGS.__dict__, "scrape_interval_seconds": 15.0, "window_seconds": 60,
                                "scrape_phase_seconds": None, "seed": 3})
    fleet = Fleet(ENGINE, initial_replicas=3, slo_ttft_p99_ms=1000, autoscaling=None)
    sim = _Simulation(fleet, settings, [Arrival(100_000.0, 10, 1)], None, 60.0)
    sim.run()

    phases = [replica.scrape_phase_s for replica in sim.replicas]
    assert len(set(phases)) == 3 and all(0 <= phase < 15.0 for phase in phases)
    for replica in sim.replicas:
        times = [sample.time_s for sample in replica.series.samples]
        assert times[0] == pytest.approx(replica.scrape_phase_s)
        assert all(later - earlier == pytest.approx(15.0) for earlier, later in zip(times, times[1:]))


def test_an_idle_fleet_scales_down_removing_the_newest_replica():
    # Nothing arrives before 10 s: the pass at 1 s is the first with two scrapes in its window,
    # which show no request and no queue.
    fleet = Fleet(ENGINE, initial_replicas=2, slo_ttft_p99_ms=1000, autoscaling=_autoscaling())
    run = simulate(fleet, SETTINGS, [Arrival(10_000.0, 10, 5)])

    assert [(event.time_s, event.from_replicas, event.to_replicas) for event in run.scaling] == [(1.0, 2, 1)]
    assert run.replicas == (ReplicaSpan("replica-0", 0.0, 0.0, None, 10.05),
                            ReplicaSpan("replica-1", 0.0, 0.0, 1.0, 1.0))
    assert run.requests[0].replica == "replica-0"


def test_a_removed_replica_finishes_what_it_holds_before_it_stops_counting():
    # Four batch slots each. Both replicas decode a 300-token request (3 s), TTFT 10 ms, no
    # queue, one slot in four busy: the pass at 1 s removes replica-1, which decodes on to 3.001 s.
    engine = Engine(EngineProfile(**{**PROFILE.__dict__, "max_batch_size": 4}), 100, 1000)
    fleet = Fleet(engine, initial_replicas=2, slo_ttft_p99_ms=1000, autoscaling=_autoscaling())
    run = simulate(fleet, SETTINGS, [Arrival(0.0, 10, 300), Arrival(1.0, 10, 300)])

    assert [(event.time_s, event.to_replicas) for event in run.scaling] == [(1.0, 1)]
    assert [r.replica for r in run.requests] == ["replica-0", "replica-1"]
    assert run.replicas[1] == ReplicaSpan("replica-1", 0.0, 0.0, 1.0, pytest.approx(3.001))
    assert run.replica_seconds() == pytest.approx(3.001 + 3.001)


def test_requests_no_engine_can_take_fail_with_the_reason():
    arrivals = [Arrival(0.0, 101, 5), Arrival(1.0, 10, 5)]
    run = simulate(Fleet(ENGINE, 1, 1000, None), SETTINGS, arrivals)
    assert run.requests[0].failure == "prompt over the engine's maxInputLen 100"
    assert run.requests[1].failure is None


def test_prometheus_rate_extrapolates_to_the_window_edges_but_not_below_zero():
    # A counter at 5, 6, 7 at 1, 2, 3 s in the window (0, 4]: 2 over the 2 s sampled; the
    # edges are 1 s away, under 1.1 sample intervals, so both extend fully (the counter would
    # reach zero only 5 s back): 4 over 4 s.
    assert extrapolated_rate([(1.0, 5.0), (2.0, 6.0), (3.0, 7.0)], 0.0, 4.0) == pytest.approx(1.0)
    # From zero: no extrapolation before the first sample.
    assert extrapolated_rate([(1.0, 0.0), (2.0, 1.0), (3.0, 2.0)], 0.0, 4.0) == pytest.approx(0.75)
    assert extrapolated_rate([(1.0, 0.0)], 0.0, 4.0) is None


def test_histogram_quantile_interpolates_within_the_bucket_and_stops_at_the_top_bound():
    bounds = (10, 1000, 1250)
    assert histogram_quantile(0.99, bounds, [1, 1, 2, 2]) == pytest.approx(1245.0)
    assert histogram_quantile(0.5, bounds, [0, 2, 2, 2]) == pytest.approx(505.0)
    assert histogram_quantile(0.99, bounds, [0, 0, 1, 2]) == 1250.0
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 0]) is None


def test_deriv_is_the_least_squares_slope():
    assert least_squares_slope([(0.0, 1.0), (1.0, 4.0), (2.0, 3.0)]) == pytest.approx(1.0)
    assert least_squares_slope([(0.0, 1.0)]) is None


def test_a_release_without_the_waiting_type_gives_no_queue_count_and_kv_and_batch_use_stand_in():
    # A queue growing from 0 to 6 over three scrapes; engine 24.12's request gauge has no
    # `waiting` type, so the operator's query finds no series: no count and no growth.
    pod = PodSeries("replica-0", [Sample(t, (0, 0), waiting, 4, 4, 10, 100)
                                  for t, waiting in ((1.0, 0), (2.0, 3), (3.0, 6))])
    bounds = (500,)
    exported = snapshot([pod], ScrapeSettings(1.0, 4), 3.0, EPOCH, bounds)
    absent = snapshot([pod], ScrapeSettings(1.0, 4, waiting_observable=False), 3.0, EPOCH, bounds)

    assert (exported.waiting_requests, exported.waiting_growth_per_second) == (6, pytest.approx(3.0))
    assert (absent.waiting_requests, absent.waiting_growth_per_second) == (None, None)
    assert absent.kv_cache_utilization == pytest.approx(0.1) and absent.batch_utilization == pytest.approx(1.0)
