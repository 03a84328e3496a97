"""A canary between two revisions whose replicas span nodes (issue 29), in a sandbox of four H100
nodes: Llama 3.1 405B in BF16, one group of two pods per replica. A new engine revision's group
is a LeaderWorkerSet of its own, ready beside stable's on the two other nodes; under load it
walks its steps (its weight, then the metric gate over the groups' leaders) and is promoted,
stable's LeaderWorkerSet deleted. A canary group made twice as slow is rolled back by the gate
while stable's group serves on untouched. The Service serves every request throughout.

Why a sandbox of its own: a replica spans nodes only when it is larger than a node (a stage's
TP group within a node, stages filling nodes: planner/layout.py), and the planner sizes an H100
node by the catalog, 8 GPUs, so a spanning replica holds more than 8 H100s and two groups more
than the 16 that the session's two H100 nodes have: no plan spans two nodes with part of each
that two groups could share. A canary of groups needs whole free nodes beside stable's
(docs/rollouts.md, "Replicas that span nodes"), so the module starts four nodes, as a real
cluster would need them."""

from __future__ import annotations

import json

import pytest

from conftest import (
    SCRAPE_INTERVAL_S,
    fault_the_new_revision,
    operator_running,
    sandbox_up,
    served_every_request,
    spanning_405b,
    spare_instance,
    steady_load,
    wait_for,
    wait_until_ready,
    watch_phases,
)
from llmfleet.api.conditions import Reason
from llmfleet.render import group, serving
from llmfleet.render.identity import COMPONENT_LABEL, DEPLOYMENT_LABEL, REVISION_LABEL

pytestmark = pytest.mark.long_running

NAMESPACE = "group-canary"
NAME = "llama-405b"
SERVING_PODS = f"{DEPLOYMENT_LABEL}={NAME},{COMPONENT_LABEL} in ({serving.COMPONENT},{group.WORKER_COMPONENT})"
# One canary group beside stable's one (50 %), then the metric gate over 30 s of load.
STEPS = [{"setWeight": 50}, {"analysis": {"durationSeconds": 30, "intervalSeconds": 10}}]


@pytest.fixture(scope="module")
def sandbox(request):
    """Four H100 nodes of 8 GPUs, two groups of two nodes: for this module's tests, in place of
    the session's sandbox (and, below, its operator), which they never start."""
    with sandbox_up(request, spare_instance("four-nodes"), "--nodes", "4", "--scrape-interval",
                    str(SCRAPE_INTERVAL_S), "--prometheus-auth", "basic", prefix="llmfleet-e2e-four-nodes-") as handle:
        yield handle


@pytest.fixture(scope="module")
def operator(sandbox, tmp_path_factory):
    with operator_running(sandbox, tmp_path_factory.mktemp("operator-four-nodes")) as process:
        yield process


@pytest.fixture(scope="module", autouse=True)
def deployed(sandbox, operator):
    sandbox.kubectl("create", "namespace", NAMESPACE)
    # The canary's group of 16 GPUs beside stable's: two groups' GPUs in the budget.
    sandbox.apply([spanning_405b(NAME, NAMESPACE, resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 32},
                                 rollout={"steps": STEPS})], namespace=NAMESPACE)
    wait_until_ready(sandbox, NAME, NAMESPACE, timeout=600)


def _status(sandbox) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", NAME, "-n", NAMESPACE)["status"]


def _groups(sandbox) -> dict[str, dict]:
    """The LeaderWorkerSets by revision."""
    items = sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE, "-l", f"{DEPLOYMENT_LABEL}={NAME}")
    return {workload["metadata"]["labels"][REVISION_LABEL]: workload for workload in items["items"]}


def _pods(sandbox, revision: str) -> list[dict]:
    """The revision's group pods, leaders and workers (not its engine build's)."""
    return [pod for pod in sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", SERVING_PODS
                                                + f",{REVISION_LABEL}={revision}")["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def _ready_groups(sandbox) -> dict[str, int]:
    return {revision: (workload.get("status") or {}).get("readyReplicas", 0)
            for revision, workload in _groups(sandbox).items()}


def test_a_canary_group_ready_beside_stables_walks_its_steps_under_load_and_is_promoted(sandbox, tmp_path):
    stable = _status(sandbox)["stableRevision"]
    load = steady_load(sandbox, NAME, NAMESPACE, 900, tmp_path)
    sandbox.kubectl("patch", "llmdeployment", NAME, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"engine": {"revision": "v2"}}}))
    canary = wait_for(lambda: (revision := _status(sandbox).get("currentRevision")) != stable and revision, 30,
                      "the new revision")
    wait_for(lambda: _ready_groups(sandbox) == {stable: 1, canary: 1}, 300,
             "the canary's group ready beside stable's, each its own LeaderWorkerSet", interval=2)
    nodes = {revision: sorted(pod["spec"]["nodeName"] for pod in _pods(sandbox, revision))
             for revision in (stable, canary)}
    assert all(len(set(held)) == 2 for held in nodes.values()) and not set(nodes[stable]) & set(nodes[canary]), nodes
    assert _groups(sandbox)[canary]["spec"]["leaderWorkerTemplate"]["size"] == 2

    phases = watch_phases(sandbox, NAME, NAMESPACE, "Promoted", 420)
    assert "Progressing" in phases, phases
    # The metric gate compared the two groups' leaders (the scraped pods) and passed.
    (passed,) = sandbox.kubectl_json("get", "events", "-n", NAMESPACE, "--field-selector",
                                     f"reason={Reason.CANARY_ANALYSIS_SUCCESSFUL}")["items"]
    assert "p99 TTFT canary" in passed["message"], passed["message"]
    assert _status(sandbox)["stableRevision"] == canary
    wait_for(lambda: list(_groups(sandbox)) == [canary] and not _pods(sandbox, stable), 120,
             "stable's LeaderWorkerSet and its group's pods gone")
    served_every_request(load, tmp_path, stop=True)


def test_a_slow_canary_group_is_rolled_back_and_stables_group_serves_on_untouched(sandbox, tmp_path):
    stable = _status(sandbox)["stableRevision"]
    stable_pods = sorted(pod["metadata"]["uid"] for pod in _pods(sandbox, stable))
    assert len(stable_pods) == 2, "stable's group: a leader and a worker"
    load = steady_load(sandbox, NAME, NAMESPACE, 900, tmp_path)
    canary = fault_the_new_revision(sandbox, NAME, NAMESPACE, "v3", "--slowdown", "2")
    phases = watch_phases(sandbox, NAME, NAMESPACE, "RolledBack", 420)
    assert "Progressing" in phases and "Promoted" not in phases, phases
    status = _status(sandbox)
    assert status["canary"]["analysisVerdict"] == "Failed" and "exceeds maxTtft" in status["canary"]["analysisMessage"]
    assert status["stableRevision"] == stable and status["canary"]["failedRevisions"] == [canary]
    wait_for(lambda: _groups(sandbox)[canary]["spec"]["replicas"] == 0 and not _pods(sandbox, canary), 120,
             "the canary's LeaderWorkerSet at zero groups, its pods gone")
    assert sorted(pod["metadata"]["uid"] for pod in _pods(sandbox, stable)) == stable_pods
    served_every_request(load, tmp_path, stop=True)
