"""Replicas that span nodes (issue 29) in a sandbox of four H100 nodes, where two groups fit:
Llama 3.1 405B in BF16, one group of two pods per replica.

A canary: a new engine revision's group is a LeaderWorkerSet of its own, ready beside stable's on
the two other nodes; under load it walks its steps (its weight, then the metric gate over the
groups' leaders) and is promoted, stable's LeaderWorkerSet deleted. A canary group made twice as
slow is rolled back by the gate while stable's group serves on untouched.

Autoscaling: a load one group cannot carry adds a second on the p99 breach; a worker killed then
restarts its whole group while the other group serves, its leader finishing its streams first
(the sandbox's mpirun aborts a leader whose worker is gone, as OpenMPI does); the load dropped, a
group goes. The Service serves every request throughout, in every test.

Why a sandbox of its own: a replica spans nodes only when it is larger than a node (a stage's
TP group within a node, stages filling nodes: planner/layout.py), and the planner sizes an H100
node by the catalog, 8 GPUs, so a spanning replica holds more than 8 H100s and two groups more
than the 16 that the session's two H100 nodes have: no plan spans two nodes with part of each
that two groups could share. A canary of groups needs whole free nodes beside stable's
(docs/rollouts.md, "Replicas that span nodes"), and so does a second group, so the module starts
four nodes, as a real cluster would need them."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from conftest import (
    LLMFLEET,
    SCRAPE_INTERVAL_S,
    StatusWatcher,
    fault_the_new_revision,
    pod_gauge,
    operator_running,
    sandbox_up,
    served_every_request,
    service_target,
    spanning_405b,
    spare_instance,
    steady_load,
    wait_for,
    wait_until_ready,
    watch_phases,
)
from llmfleet.api.conditions import Reason
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.render import group, layout, serving
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


@pytest.fixture(scope="module")
def deployed(sandbox, operator):
    sandbox.kubectl("create", "namespace", NAMESPACE)
    # The canary's group of 16 GPUs beside stable's: two groups' GPUs in the budget.
    sandbox.apply([spanning_405b(NAME, NAMESPACE, resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 32},
                                 rollout={"steps": STEPS})], namespace=NAMESPACE)
    wait_until_ready(sandbox, NAME, NAMESPACE, timeout=600)


def _status(sandbox, namespace: str = NAMESPACE) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", NAME, "-n", namespace)["status"]


def _groups(sandbox, namespace: str = NAMESPACE) -> dict[str, dict]:
    """The LeaderWorkerSets by revision."""
    items = sandbox.kubectl_json("get", "leaderworkersets", "-n", namespace, "-l", f"{DEPLOYMENT_LABEL}={NAME}")
    return {workload["metadata"]["labels"][REVISION_LABEL]: workload for workload in items["items"]}


def _pods(sandbox, revision: str, namespace: str = NAMESPACE) -> list[dict]:
    """The revision's group pods, leaders and workers (not its engine build's)."""
    return [pod for pod in sandbox.kubectl_json("get", "pods", "-n", namespace, "-l", SERVING_PODS
                                                + f",{REVISION_LABEL}={revision}")["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def _ready_groups(sandbox, namespace: str = NAMESPACE) -> dict[str, int]:
    return {revision: (workload.get("status") or {}).get("readyReplicas", 0)
            for revision, workload in _groups(sandbox, namespace).items()}


def test_a_canary_group_ready_beside_stables_walks_its_steps_under_load_and_is_promoted(sandbox, deployed, tmp_path):
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


def test_a_slow_canary_group_is_rolled_back_and_stables_group_serves_on_untouched(sandbox, deployed, tmp_path):
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


AUTOSCALED = "group-autoscaling"
LWS = load_lws_record()
# One group serves at most its batch of 4 streams, about 2.1 s each (32 tokens at the emulated
# engine's 66 ms a token): 1.9 requests/s. 2.5 breach the 5 s SLO's p99 target within seconds and
# two groups carry them (`llmfleet simulate`: one group to two at 10-20 s in each of 3 seeds).
# Then 0.3 requests/s of 96 tokens (6.3 s each, so that the worker can die while its leader streams)
# fill about half of one group's batch, under the 70 % a scale-down keeps: two groups become one
# after the stabilisation window, which outlasts a group's restart.
HIGH_REQUESTS_PER_S, LOW_REQUESTS_PER_S = 2.5, 0.3
LOW_OUTPUT_TOKENS = 96
SCALE_DOWN_STABILIZATION_S = 60


def _load(sandbox, requests_per_s: float, output, output_tokens: int = 32) -> subprocess.Popen:
    """Requests through the Service, for up to 15 minutes (the test stops it)."""
    return subprocess.Popen(
        [*LLMFLEET, "load", "--target", service_target(sandbox, NAME, AUTOSCALED, timeout=60), "--model", "ensemble",
         "--schedule", f"constant:{requests_per_s}", "--duration-s", "900", "--input-tokens", "lognormal:128:256",
         "--output-tokens", f"fixed:{output_tokens}", "--output-dir", str(output), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _group_pods(sandbox) -> dict[tuple[str, str], dict]:
    """The autoscaled deployment's group pods by (group index, worker index)."""
    pods = sandbox.kubectl_json("get", "pods", "-n", AUTOSCALED, "-l", f"{DEPLOYMENT_LABEL}={NAME}")["items"]
    return {(pod["metadata"]["labels"][LWS.group_index_label], pod["metadata"]["labels"][LWS.worker_index_label]): pod
            for pod in pods if LWS.worker_index_label in pod["metadata"]["labels"]
            and not pod["metadata"].get("deletionTimestamp")}


def _active_requests(leader: dict) -> float:
    """The requests a leader's engine has in flight."""
    return pod_gauge(f"http://{leader['status']['podIP']}:{layout.METRICS_PORT}/metrics", layout.REQUEST_GAUGE,
                     layout.REQUEST_TYPE_LABEL, layout.ACTIVE_REQUESTS)


def _ready_group_count(sandbox) -> int:
    (workload,) = _groups(sandbox, AUTOSCALED).values()
    return (workload.get("status") or {}).get("readyReplicas", 0)


def test_autoscaling_adds_a_group_restarts_one_whose_worker_died_and_removes_one_without_losing_a_request(
        sandbox, operator, tmp_path):
    """One group, then two on a load it cannot carry; the load drops, group 0's worker is deleted
    and its group made again while group 1 serves; after the stabilisation window one group
    again. Every request of both loads served, none cut.

    The worker dies while its leader streams, so that both waits are needed: the worker's for its
    leader (or the sandbox's mpirun kills the leader, as OpenMPI would) and the leader's preStop
    drain for its streams (or they stall at Triton's stop, docs/render.md "Draining")."""
    # The canaries' groups hold all four nodes: their namespace goes first.
    sandbox.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=300s")
    sandbox.kubectl("create", "namespace", AUTOSCALED)
    sandbox.apply([spanning_405b(NAME, AUTOSCALED, plan={}, resources={
        "allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 32}, autoscaling={
        "enabled": True, "minReplicas": 1, "maxReplicas": 2,
        "scaleDownStabilizationSeconds": SCALE_DOWN_STABILIZATION_S, "cooldownSeconds": 15})], namespace=AUTOSCALED)
    wait_until_ready(sandbox, NAME, AUTOSCALED, timeout=600)
    assert _ready_group_count(sandbox) == 1
    watcher = StatusWatcher(sandbox, NAME, AUTOSCALED)
    thread = threading.Thread(target=watcher.run, args=(time.monotonic(),), daemon=True)
    thread.start()
    try:
        high = _load(sandbox, HIGH_REQUESTS_PER_S, tmp_path / "high")
        wait_for(lambda: _ready_group_count(sandbox) == 2, 300, "a second group ready on the p99 breach", interval=2)
        changes = watcher.replica_changes()
        assert changes and changes[0][1] == 2, watcher.timeline()
        pods = _group_pods(sandbox)
        assert len({pod["spec"]["nodeName"] for pod in pods.values()}) == 4, "two groups on four nodes"
        served_every_request(high, tmp_path / "high", stop=True)

        # The load drops. A worker dies while its leader streams: its group is made again while
        # the other one serves, the leader's streams finished first (the worker waits for them).
        dropped_s = watcher.samples[-1].seconds
        low = _load(sandbox, LOW_REQUESTS_PER_S, tmp_path / "low", output_tokens=LOW_OUTPUT_TOKENS)
        wait_for(lambda: _active_requests(pods[("0", "0")]) >= 1, 60, "a stream in flight on group 0's leader",
                 interval=0.2)
        killed = {key: pod["metadata"]["uid"] for key, pod in pods.items() if key[0] == "0"}
        sandbox.kubectl("delete", "pod", pods[("0", "1")]["metadata"]["name"], "-n", AUTOSCALED, "--wait=false")

        def group_zero_made_again():
            now = _group_pods(sandbox)
            return all(key in now and now[key]["metadata"]["uid"] != uid for key, uid in killed.items())
        wait_for(group_zero_made_again, 120, "the killed worker's group made again, leader and worker")
        wait_for(lambda: _ready_group_count(sandbox) == 2, 120, "the group made again ready", interval=2)

        # A group goes after the stabilisation window, its streams finished.
        wait_for(lambda: _ready_group_count(sandbox) == 1 and len(_group_pods(sandbox)) == 2, 300,
                 "one group again, the other's pods gone", interval=2)
        downs = [(seconds, replicas) for seconds, replicas in watcher.replica_changes(dropped_s) if replicas < 2]
        assert downs and downs[0][0] >= dropped_s + SCALE_DOWN_STABILIZATION_S, watcher.timeline()
        time.sleep(10)  # requests sent while the group went finish on the one left
        served_every_request(low, tmp_path / "low", stop=True)
    finally:
        watcher.stop.set()
        thread.join()
