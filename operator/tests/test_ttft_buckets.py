"""The TTFT histogram's bounds per deployment (render.ttft_buckets), what rendering does with
them, and the bound on the p99 Prometheus reads from them against the exact p99 of the same
requests."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from llmfleet.api import AutoscalingSpec, LLMDeployment
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, render, revision_hash
from llmfleet.render.ttft_buckets import (
    BOUNDS_ANNOTATION,
    COARSE_BOUNDS_MS,
    DENSE_REACH,
    MAX_BOUNDS,
    UNRECORDED_BOUNDS_MS,
    deployment_ttft_bounds_ms,
    recorded_ttft_bounds_ms,
    shared_ttft_bounds_ms,
    slo_ttft_bounds_ms,
    ttft_bounds_ms,
)
from llmfleet.simulation.prometheus_view import TtftHistogram, histogram_quantile
from render_builders import manifest

SLOS_MS = (20, 50, 100, 300, 500, 1000, 2000, 5000, 30000, 120000, 600000)
# The bound on |histogram p99 - exact p99| / exact p99 for a p99 in the dense range (from the
# scale-down threshold to the target, around the SLO, and for the default target the way
# between them), at SLOs from 100 ms: within one dense step (<= 4.9 %: DENSE_BOUNDS_BUDGET over
# the widest dense range) and 1 ms of rounding.
P99_ERROR_BOUND = 0.05


def _targets(slo_ms: int) -> list[tuple[int, bool]]:
    """(target, whether it floats): the default, and pinned ones from 1 ms to the SLO."""
    pinned = sorted({1, max(1, slo_ms // 10), max(1, slo_ms // 2), max(1, round(slo_ms * 0.9)), slo_ms})
    return [(round(slo_ms * 0.6), True), *((target, False) for target in pinned)]


@pytest.mark.parametrize("slo_ms", SLOS_MS)
def test_the_slo_and_the_target_are_bounds_among_the_coarse_ladder_and_the_count_is_bounded(slo_ms):
    for target_ms, floats in _targets(slo_ms):
        bounds = ttft_bounds_ms(slo_ms, target_ms, target_floats=floats)
        assert list(bounds) == sorted(set(bounds)) and all(isinstance(b, int) and b >= 1 for b in bounds)
        assert {slo_ms, target_ms, *COARSE_BOUNDS_MS} <= set(bounds)
        assert len(bounds) <= MAX_BOUNDS, (slo_ms, target_ms, len(bounds))


@pytest.mark.parametrize("slo_ms", [s for s in SLOS_MS if s >= 50])
def test_bounds_are_a_few_percent_apart_around_the_target_and_the_slo(slo_ms):
    for target_ms, floats in _targets(slo_ms):
        bounds = ttft_bounds_ms(slo_ms, target_ms, target_floats=floats)
        # From under the scale-down threshold (half the target at the least) to over the target.
        dense = [(target_ms * 0.5 * (1 - DENSE_REACH), target_ms * (1 + DENSE_REACH)),
                 (slo_ms * (1 - DENSE_REACH), slo_ms * (1 + DENSE_REACH))]
        if floats:
            dense.append((target_ms, slo_ms))
        for low, high in dense:
            if low < 40:  # whole milliseconds: 1 ms apart is all there is down there
                continue
            covering = [b for b in bounds if b <= low][-1:] + [b for b in bounds if low < b < high] + \
                [b for b in bounds if b >= high][:1]
            # One step of the grid (whole milliseconds: rounding may add 1 ms).
            assert all(upper - lower <= 0.05 * lower + 1 for lower, upper in zip(covering, covering[1:])), \
                (slo_ms, target_ms, low, high, covering)


def _lognormal(rng: random.Random, p99_ms: float, sigma: float, n: int) -> list[float]:
    """TTFTs whose 99th percentile is `p99_ms`: a prefill-like spread (`sigma`)."""
    median = p99_ms / math.exp(2.326 * sigma)
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def _queueing(rng: random.Random, p99_ms: float, n: int) -> list[float]:
    """A prefill floor plus an exponential wait (an M/M/1-like tail), its p99 at `p99_ms`."""
    floor_ms = 0.3 * p99_ms
    return [floor_ms + rng.expovariate(math.log(100) / (p99_ms - floor_ms)) for _ in range(n)]


def _bimodal(rng: random.Random, p99_ms: float, n: int) -> list[float]:
    """Short prompts fast, 3 % long ones slow (the long ones set the p99)."""
    return [rng.gauss(0.2 * p99_ms, 0.02 * p99_ms) if rng.random() > 0.03 else rng.uniform(0.8, 1.1) * p99_ms
            for _ in range(n)]


def histogram_p99_error(ttfts_ms: list[float], bounds_ms: tuple[int, ...]) -> float:
    """(histogram_quantile(0.99) over `bounds_ms`) / (the exact p99 of the same requests) - 1."""
    histogram = TtftHistogram(bounds_ms)
    for ttft in ttfts_ms:
        histogram.observe(ttft)
    exact = float(np.percentile(ttfts_ms, 99))
    return histogram_quantile(0.99, bounds_ms, histogram.cumulative()) / exact - 1


def _worst_error(slo_ms: int, bounds_ms: tuple[int, ...]) -> float:
    """The largest |error| over distributions whose p99 lies from 0.45 x the default target to
    1.1 x the SLO (the sample's own p99 may stray a few percent further)."""
    rng = random.Random(slo_ms)
    target_ms = slo_ms * 0.6
    placements = [target_ms * share for share in (0.45, 0.5, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2)] + \
        [slo_ms * share for share in (0.9, 1.0, 1.1)]
    worst = 0.0
    for p99_ms in placements:
        for ttfts in (_lognormal(rng, p99_ms, 0.3, 5000), _lognormal(rng, p99_ms, 0.8, 5000),
                      _queueing(rng, p99_ms, 5000), _bimodal(rng, p99_ms, 5000)):
            worst = max(worst, abs(histogram_p99_error(ttfts, bounds_ms)))
    return worst


@pytest.mark.parametrize("slo_ms", [100, 500, 1000, 2000])
def test_the_p99_read_from_the_deployments_buckets_is_within_the_bound(slo_ms):
    bounds = slo_ttft_bounds_ms(slo_ms, AutoscalingSpec())
    assert _worst_error(slo_ms, bounds) <= P99_ERROR_BOUND


@pytest.mark.parametrize("slo_ms", [500, 1000, 2000])
def test_the_fixed_buckets_they_replace_were_not(slo_ms):
    assert _worst_error(slo_ms, UNRECORDED_BOUNDS_MS) > P99_ERROR_BOUND


def _deployment(slo_ms: int = 1000, target_ms: int | None = None):
    body = manifest(1)
    body["spec"]["slo"]["ttftP99Ms"] = slo_ms
    body["spec"].setdefault("autoscaling", {})["targetTtftP99Ms"] = target_ms
    deployment = LLMDeployment.from_manifest(body)
    return deployment, plan(plan_request_from_spec(deployment.spec))


def test_the_bounds_are_rendered_recorded_and_make_the_revision():
    deployment, chosen = _deployment()
    bounds = deployment_ttft_bounds_ms(deployment.spec)
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=1)
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["tensorrt_llm.config.pbtxt"]
    assert f"buckets: [ {', '.join(f'{float(b)}' for b in bounds)} ]" in config
    server = next(o for o in objects if o["kind"] == "Deployment")
    assert recorded_ttft_bounds_ms(server) == bounds
    assert BOUNDS_ANNOTATION not in server["spec"]["template"]["metadata"].get("annotations", {})
    # Another SLO or target is another histogram: all pods of one revision export the same one.
    hashes = {revision_hash(d.spec, p) for d, p in (_deployment(), _deployment(500), _deployment(1000, 300))}
    assert len(hashes) == 3


def test_readers_share_the_bounds_of_every_serving_revision():
    deployment, _ = _deployment()
    old = {"metadata": {"annotations": {BOUNDS_ANNOTATION: "100,300,400,500"}}}
    new = {"metadata": {"annotations": {BOUNDS_ANNOTATION: "100,300,350,400,500"}}}
    assert shared_ttft_bounds_ms([old, new], deployment.spec) == (100, 300, 400, 500)
    assert shared_ttft_bounds_ms([new], deployment.spec) == (100, 300, 350, 400, 500)
    assert shared_ttft_bounds_ms([], deployment.spec) == deployment_ttft_bounds_ms(deployment.spec)
    # A workload rendered before the bounds were recorded has the one fixed set of that time.
    assert recorded_ttft_bounds_ms({"metadata": {}}) == UNRECORDED_BOUNDS_MS
