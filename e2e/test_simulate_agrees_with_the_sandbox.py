"""`llmfleet simulate` against the sandbox (issue 30 part 2): the same autoscaled spec and the
same seeded traffic run live (real operator, Prometheus, Triton with the emulated engine) and in
virtual time must come to the same SLO attainment (within 2 points) and replica-seconds (within
10 %). Where they differ, the simulator is wrong. benchmarks/bench_simulate_vs_live.py runs
more traces at the sandbox's default scrape interval."""

from __future__ import annotations

import pytest

from conftest import SCRAPE_INTERVAL_S, small_batch_70b, temporary_namespace
from llmfleet.catalog import load_catalog
from llmfleet.planner.hf_config import architecture_from_hf_config
from llmfleet.simulation.routing import ROUND_ROBIN
from llmfleet_sandbox.hub import HUB_REPOS, hf_config
from simulation_agreement import Traffic, compare

pytestmark = pytest.mark.long_running

NAMESPACE = "simulate-agreement"
SLO_TTFT_MS = 500
# A climb from 0.5 to 5 requests/s over two minutes, a minute at the peak, then the fall: one
# replica carries about 3.5 of these requests/s, so the autoscaler must add two. A steeper climb
# (to 6 in one minute) was tried first: its attainment turns on when within a scrape interval
# the live pass sees the breach, about a third of a point per second of it, and live runs spread
# by 3 points (93.2-95.6 % against 96.4 % simulated); bench_simulate_vs_live.py reports it.
CLIMB = Traffic.scheduled("ramp:0:0.5,30:0.5,150:5,210:5,240:0.5", 330)
# Connections spread in turn (IPVS rr), not at random as by default: at random, one run's
# attainment turns on where its requests happen to land. Over twelve routing seeds the simulator
# put this climb at 95.1-98.5 %; one live run (random, TP1) came to 97.6 % against 96.6 %
# simulated. One draw of each would miss the 2-point limit too often to be a test; in turn, both
# sides are one outcome. (An earlier live run at random kept 99.87 %: it served TP2, see below.)
ROUTING = ROUND_ROBIN
# Llama 3.1 70B's architecture inline under the base model's repository, imported from the
# config.json the sandbox's hub serves for it as `llmfleet model import` would, not the catalog's
# llama-3.1-70b: the operator plans a fresh deployment with the speeds every deployment of its
# model has learned, and other tests' deployments of llama-3.1-70b learn slow ones (engines slowed
# on purpose, replicas swamped). At 0.6 of the modelled speed one H100 misses the 50 ms TPOT
# target and the plan is TP2. In one full e2e run the live client saw 23 ms per token (TP2's step;
# TP1's is 34 ms), and in one CI run the live fleet scaled 85 s later than the simulated one, which
# knows no other deployment and plans TP1. With a model key of its own it is planned as the
# simulator plans it; the same numbers give the same plan and simulation (`llmfleet simulate`).
BASE_REPOSITORY = "meta-llama/Llama-3.1-70B"
LLAMA_70B_INLINE = {"source": f"hf://{BASE_REPOSITORY}", "architecture": architecture_from_hf_config(
    hf_config(load_catalog().model(HUB_REPOS[BASE_REPOSITORY]))).architecture.model_dump(
        mode="json", by_alias=True, exclude_none=True)}


@pytest.fixture(scope="module", autouse=True)
def agreement_namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


def test_a_climb_and_fall_simulated_comes_to_the_live_runs_attainment_and_replica_seconds(sandbox, tmp_path):
    # The API's autoscaling defaults, as a user who asks only for autoscaling gets them.
    manifest = small_batch_70b("climb", NAMESPACE, SLO_TTFT_MS,
                               autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 3})
    manifest["spec"]["model"] = LLAMA_70B_INLINE
    agreement = compare(sandbox, manifest, CLIMB, SLO_TTFT_MS, SCRAPE_INTERVAL_S, tmp_path, ROUTING)
    print(agreement.describe())  # the figures, shown with -rP
    assert agreement.live.requests == agreement.simulated.requests, agreement.describe()
    assert agreement.live.peak_replicas > 1, f"the climb never scaled live: {agreement.describe()}"
    assert agreement.live_run.plan == "H100x1 FP8", agreement.describe()
    assert agreement.agrees, agreement.describe()
