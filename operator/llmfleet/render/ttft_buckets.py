"""The TTFT histogram's bucket bounds, per deployment (pure).

Prometheus knows a quantile only to within the bucket it falls in and interpolates linearly
inside it, so a p99 read from wide buckets can be off by a large share of the bucket. The
bounds are dense (a few percent apart) where the operator compares the p99 with a number: the
autoscaler's scale-down threshold (half the target, policy.scale_down_threshold), its target
and tolerance band, and the SLO; coarse elsewhere, where the decision is the same whatever the
exact value (a p99 below the dense range reads below it, one above reads above it). The SLO and
the target are bounds themselves, so "within the SLO" is one bucket's count (exact attainment).
A fixed coarse ladder, reaching minutes so that a backlog's tail stays visible, is in every
deployment's bounds: any two revisions share at least it.

The bounds are whole milliseconds: the chart's SLO rules join on the `le` label as an integer.

Each bound is one series per serving pod (plus `+Inf`, `_sum` and `_count`) that Prometheus
keeps in memory and writes every scrape: `MAX_BOUNDS` fixes that cost at 63 series a replica
whatever the SLO and target (the fixed bounds this replaced cost 28), with the dense step at
5 % or finer. Finer would buy little: the p99 of the autoscaler's window of a few dozen
requests is itself off by more than that from the requests' own (benchmarks/bench_ttft_histogram.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from llmfleet.api import AutoscalingSpec, LLMDeploymentSpec
from llmfleet.autoscale import DEFAULT_TUNING, target_ttft_p99_ms

# Coarse bounds shared by every deployment, to the long tail of a backlog at 5 minutes (beyond
# it the p99 reads as the top bound, "over 300000 ms"). From 100 ms to 15 s at most 1.67x
# apart: above the dense range the autoscaler still sizes a scale-up by p99 / target and
# compares the p99 with the longest prompt's prefill (capacity.futile_scale_up). Coarser below
# (a p99 under the dense range decides the same whatever its value) and in a backlog of
# minutes (a scale-up is bounded by maxScaleUpStep anyway).
COARSE_BOUNDS_MS = (10, 25, 50, 100, 150, 250, 400, 600, 1000, 1500, 2500, 4000, 6000, 10000, 15000, 30000,
                    60000, 120000, 300000)
# Prometheus series per pod stay bounded: the coarse ladder, the dense grid's budget, and the
# target (the SLO is on the grid) plus what the grid adds at the ends of each of the (at most
# two) dense ranges, up to three (one point past each end, and rounding).
MAX_BOUNDS = 60
_TARGET_AND_ENDS = 7
DENSE_BOUNDS_BUDGET = MAX_BOUNDS - len(COARSE_BOUNDS_MS) - _TARGET_AND_ENDS
# Dense reach beyond the scale-down threshold and the target, and either side of the SLO:
# twice the autoscaler's default tolerance band (10 %), in relative terms.
DENSE_REACH = 0.2
# Finest spacing between dense bounds: below it the 1 ms rounding dominates anyway for small SLOs,
# and the budget is better spent on reach.
FINEST_STEP = 0.02
# The annotation on a revision's serving workload recording the bounds its pods export: readers
# without that revision's spec (the stable revision during a canary) read them there.
BOUNDS_ANNOTATION = "llmfleet.io/ttft-histogram-bounds-ms"
# Bounds of serving workloads rendered before the annotation existed (one fixed set then).
UNRECORDED_BOUNDS_MS = (10, 25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 650, 800, 1000, 1250, 1500,
                        2000, 3000, 5000, 10000, 20000, 30000, 60000, 120000, 300000)


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for low, high in sorted(intervals):
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def ttft_bounds_ms(slo_ttft_p99_ms: int, target_ttft_p99_ms: int, *, target_floats: bool) -> tuple[int, ...]:
    """The bucket bounds for an SLO and the autoscaler's target: the coarse ladder plus a grid
    dense from the scale-down threshold to the target and around the SLO, the SLO and the target
    among the bounds. The threshold lies from half the target (no prefill floor known) up to the
    target (policy.scale_down_threshold). `target_floats`: the target is the default, which the
    autoscaler moves up towards the SLO with the prefill floor it learns
    (policy.target_ttft_p99_ms), so the whole way from it to the SLO is dense too. The grid's
    spacing is the finest that fits `DENSE_BOUNDS_BUDGET` (never under `FINEST_STEP`)."""
    lowest_threshold_ms = target_ttft_p99_ms * DEFAULT_TUNING.scale_down_below_target_fraction
    dense = [(lowest_threshold_ms * (1 - DENSE_REACH), target_ttft_p99_ms * (1 + DENSE_REACH)),
             (slo_ttft_p99_ms * (1 - DENSE_REACH), slo_ttft_p99_ms * (1 + DENSE_REACH))]
    if target_floats:
        dense.append((target_ttft_p99_ms, slo_ttft_p99_ms))
    intervals = _merged(dense)
    log_width = sum(math.log(high / low) for low, high in intervals)
    step = max(math.log1p(FINEST_STEP), log_width / DENSE_BOUNDS_BUDGET)
    grid = set()
    for low, high in intervals:
        # On the SLO's own grid, so that the SLO is a bound and its neighbours are a step away;
        # from the grid point at or below `low` to the one at or above `high`.
        first = math.floor(math.log(low / slo_ttft_p99_ms) / step + 1e-9)
        last = math.ceil(math.log(high / slo_ttft_p99_ms) / step - 1e-9)
        grid.update(round(slo_ttft_p99_ms * math.exp(k * step)) for k in range(first, last + 1))
    bounds = {*COARSE_BOUNDS_MS, *grid, slo_ttft_p99_ms, target_ttft_p99_ms}
    return tuple(sorted(bound for bound in bounds if bound >= 1))


def slo_ttft_bounds_ms(slo_ttft_p99_ms: int, autoscaling: AutoscalingSpec) -> tuple[int, ...]:
    """`ttft_bounds_ms` at an SLO and the autoscaler's target for it (pinned, or the default at
    no known prefill floor)."""
    return ttft_bounds_ms(slo_ttft_p99_ms, target_ttft_p99_ms(autoscaling, slo_ttft_p99_ms),
                          target_floats=autoscaling.target_ttft_p99_ms is None)


def deployment_ttft_bounds_ms(spec: LLMDeploymentSpec) -> tuple[int, ...]:
    """The bounds a deployment's serving pods export."""
    return slo_ttft_bounds_ms(spec.slo.ttft_p99_ms, spec.autoscaling)


def bounds_annotation(bounds_ms: Iterable[int]) -> dict[str, str]:
    return {BOUNDS_ANNOTATION: ",".join(str(bound) for bound in bounds_ms)}


def recorded_ttft_bounds_ms(workload: Mapping) -> tuple[int, ...]:
    """The bounds a revision's serving workload (Deployment or LeaderWorkerSet) was rendered
    with, from its annotation."""
    recorded = ((workload.get("metadata") or {}).get("annotations") or {}).get(BOUNDS_ANNOTATION)
    if not recorded:
        return UNRECORDED_BOUNDS_MS
    return tuple(int(bound) for bound in recorded.split(","))


def shared_ttft_bounds_ms(serving_workloads: Iterable[Mapping], spec: LLMDeploymentSpec) -> tuple[int, ...]:
    """The bounds every serving revision's pods export (the spec's own before any serves): a
    query summing histograms over revisions reads only these, since a bucket some pods lack
    would count the others' requests alone. Revisions of one deployment share at least the
    coarse ladder, and all of them when the SLO and target did not change between them."""
    bound_sets = [set(recorded_ttft_bounds_ms(workload)) for workload in serving_workloads]
    return tuple(sorted(set.intersection(*bound_sets))) if bound_sets else deployment_ttft_bounds_ms(spec)
