"""Replicas that span nodes (issue 29) through the operator, the real LeaderWorkerSet controller
and the sandbox's rank-group launch: Llama 3.1 405B in BF16 needs 16 H100s, so its one replica
is a group of two pods, one per H100 node, the leader serving through the Service. A worker
killed restarts its whole group. The sandbox has two H100 nodes, so it holds one such group:
the replica that keeps serving meanwhile is a single-node one (Llama 3.1 8B on the L40S node),
which also shows that a single-node plan still renders a Deployment. Scaled to two groups, the
second waits for nodes, saying which, and scaled back it goes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import (
    condition,
    llm_deployment,
    served_every_request,
    spanning_405b,
    steady_load,
    temporary_namespace,
    wait_for,
    wait_until_ready,
)
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.render import group, serving
from llmfleet.render.identity import DEPLOYMENT_LABEL

NAMESPACE = "spanning"
SPANNING, SINGLE = "llama-405b", "llama-8b"
LWS = load_lws_record()
ENGINE = {"runtime": "engine", "maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048, "maxNumTokens": 2048}
WORKLOAD = {"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 32, "outputTokensP99": 64,
            "peakRequestsPerSecond": 0.5}


def spanning() -> dict:
    return spanning_405b(SPANNING, NAMESPACE)


def single() -> dict:
    return llm_deployment(SINGLE, NAMESPACE, "llama-3.1-8b", engine=ENGINE, workload=WORKLOAD,
                          slo={"ttftP99Ms": 5000, "tpotP99Ms": 200},
                          resources={"allowedGpuTypes": ["L40S-48GB"]}, plan={"replicas": 1})


def load(sandbox, name: str, seconds: int, output) -> subprocess.Popen:
    return steady_load(sandbox, name, NAMESPACE, seconds, output)


def group_pods(sandbox) -> dict[str, dict]:
    """The spanning replica's pods by worker index ("0" the leader)."""
    pods = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"{DEPLOYMENT_LABEL}={SPANNING}")["items"]
    return {pod["metadata"]["labels"][LWS.worker_index_label]: pod for pod in pods
            if not pod["metadata"].get("deletionTimestamp") and LWS.worker_index_label in pod["metadata"]["labels"]}


@pytest.fixture(scope="module")
def deployed(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE, wait_s=180):
        sandbox.apply([spanning(), single()], namespace=NAMESPACE)
        wait_until_ready(sandbox, SINGLE, NAMESPACE, timeout=300)
        wait_until_ready(sandbox, SPANNING, NAMESPACE, timeout=600)
        yield


def test_a_replica_spanning_two_nodes_is_ready_and_serves_through_its_service(sandbox, deployed, tmp_path):
    status = sandbox.kubectl_json("get", "llmdeployment", SPANNING, "-n", NAMESPACE)["status"]
    assert (status["plan"]["tensorParallelSize"], status["plan"]["pipelineParallelSize"],
            status["plan"]["nodesPerReplica"]) == (8, 2, 2), status["plan"]
    (workload,) = sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE)["items"]
    assert workload["spec"]["leaderWorkerTemplate"]["size"] == 2 and workload["status"]["readyReplicas"] == 1
    assert not sandbox.kubectl_json("get", "deployments", "-n", NAMESPACE, "-l",
                                    f"{DEPLOYMENT_LABEL}={SPANNING}")["items"]
    pods = group_pods(sandbox)
    assert sorted(pods) == ["0", "1"]
    assert pods["0"]["spec"]["nodeName"] != pods["1"]["spec"]["nodeName"], "the group's pods share a node"
    # The leader ran the recorded launch: its mpirun checked the worker, rank 0 serves here.
    leader_log = sandbox.container_log(pods["0"], serving.CONTAINER)
    assert "mpirun (sandbox): world size 16, 8 on this host" in leader_log, leader_log[-2000:]
    assert pods["0"]["spec"]["serviceAccountName"] == group.LAUNCHER_SERVICE_ACCOUNT
    served_every_request(load(sandbox, SPANNING, 10, tmp_path), tmp_path)


def test_a_worker_killed_restarts_its_whole_group_while_another_replica_serves(sandbox, deployed, tmp_path):
    before = group_pods(sandbox)
    meanwhile = load(sandbox, SINGLE, 600, tmp_path / "single")
    sandbox.kubectl("delete", "pod", before["1"]["metadata"]["name"], "-n", NAMESPACE, "--wait=false")

    def recreated():
        pods = group_pods(sandbox)
        return pods if (sorted(pods) == ["0", "1"] and all(
            pods[index]["metadata"]["uid"] != before[index]["metadata"]["uid"] for index in pods)) else None
    wait_for(recreated, 120, "the group's leader and worker recreated (RecreateGroupOnPodRestart)")
    wait_for(lambda: (sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE)["items"][0]
                      .get("status", {}).get("readyReplicas") == 1), 300, "the recreated group ready")
    served_every_request(meanwhile, tmp_path / "single", stop=True)
    served_every_request(load(sandbox, SPANNING, 10, tmp_path / "spanning"), tmp_path / "spanning")


def test_a_single_node_plan_still_renders_a_deployment(sandbox, deployed):
    (workload,) = sandbox.kubectl_json("get", "deployments", "-n", NAMESPACE, "-l",
                                       f"{DEPLOYMENT_LABEL}={SINGLE}")["items"]
    assert workload["status"]["readyReplicas"] == 1
    assert not sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE, "-l",
                                    f"{DEPLOYMENT_LABEL}={SINGLE}")["items"]


def _spanning_status(sandbox) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", SPANNING, "-n", NAMESPACE)


def _groups(sandbox) -> dict:
    (workload,) = sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE)["items"]
    return workload


def test_a_multi_node_deployment_scales_to_two_groups_and_back_while_its_service_serves(sandbox, deployed, tmp_path):
    """`kubectl scale` to two groups: the LeaderWorkerSet gets two, and the second, which the two
    H100 nodes cannot hold beside the first, waits, its pods named with their group and the
    nodes that lack a part said (in the plan's shortfall and the not-ready reason); `fleet status` counts the groups' GPUs per node. Back to one, the second
    group goes. The Service serves throughout. (Two groups serving would need four H100 nodes;
    the session's sandbox has two.)"""
    meanwhile = load(sandbox, SPANNING, 600, tmp_path)
    # Two groups of 16 GPUs: the budget first, or the plan is refused (gpu-budget).
    sandbox.kubectl("patch", "llmdeployment", SPANNING, "-n", NAMESPACE, "--type=merge", "-p",
                    json.dumps({"spec": {"resources": {"gpuBudget": 32}}}))
    sandbox.kubectl("scale", "llmdeployment", SPANNING, "-n", NAMESPACE, "--replicas=2")
    wait_for(lambda: _groups(sandbox)["spec"]["replicas"] == 2, 60, "the LeaderWorkerSet at two groups")
    name = _groups(sandbox)["metadata"]["name"]

    def second_group_waits():
        obj = _spanning_status(sandbox)
        planned, progressing = condition(obj, "Planned") or {}, condition(obj, "Progressing") or {}
        degraded = condition(obj, "Degraded") or {}
        said = f"{progressing.get('message', '')} {degraded.get('message', '')}"
        return ((planned, said) if planned.get("reason") == "CapacityShortfall"
                and f"group {name}-1, " in said and "Unschedulable" in said and "nodes for a part" in said
                else None)
    planned, said = wait_for(second_group_waits, 180, "the second group waiting, its pods and the nodes named")
    # The first group holds both H100 nodes: neither has a part free for the second.
    assert ("nodes for a part of 8 H100-SXM-80GB: no node has 8 free; lacking per node: gpu-node-1 8, "
            "gpu-node-2 8") in said, said
    assert ("4 nodes with 8 free are needed and 2 have them (gpu-node-1 8, gpu-node-2 8)"
            in planned["message"]), planned
    assert condition(_spanning_status(sandbox), "Ready")["status"] == "True"
    report = subprocess.run([sys.executable, "-m", "llmfleet", "fleet", "status"], env=sandbox.env,
                            capture_output=True, text=True, check=True).stdout
    row = next(line for line in report.splitlines() if line.startswith(f"  {NAMESPACE}/{SPANNING} "))
    assert "32 (2 x 2 nodes of 8)" in row and "1/2" in row, report

    sandbox.kubectl("scale", "llmdeployment", SPANNING, "-n", NAMESPACE, "--replicas=1")

    def one_group_again():
        obj, pods = _spanning_status(sandbox), sandbox.kubectl_json(
            "get", "pods", "-n", NAMESPACE, "-l", f"{LWS.name_label}={name}")["items"]
        return (_groups(sandbox)["spec"]["replicas"] == 1 and condition(obj, "Planned")["status"] == "True"
                and condition(obj, "Ready")["status"] == "True" and (obj["status"].get("readyReplicas") == 1)
                and sorted(pod["metadata"]["labels"].get(LWS.group_index_label) for pod in pods) == ["0", "0"])
    wait_for(one_group_again, 180, "one group again, the second one's pods gone", interval=2)
    served_every_request(meanwhile, tmp_path, stop=True)


def test_a_replica_that_no_longer_spans_nodes_rolls_out_as_a_deployment(sandbox, deployed, tmp_path):
    """The 405B replica re-planned as the 8B on one L40S: the new revision is a Deployment, and
    once it is ready the LeaderWorkerSet revision is pruned (the operator's delete)."""
    sandbox.kubectl("patch", "llmdeployment", SPANNING, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(
        {"spec": {"model": single()["spec"]["model"], "resources": {"allowedGpuTypes": ["L40S-48GB"]}}}))

    def rolled_out():
        workloads = sandbox.kubectl_json("get", "deployments", "-n", NAMESPACE, "-l", f"{DEPLOYMENT_LABEL}={SPANNING}")
        groups = sandbox.kubectl_json("get", "leaderworkersets", "-n", NAMESPACE)["items"]
        ready = [w for w in workloads["items"] if (w.get("status") or {}).get("readyReplicas") == 1]
        return ready if ready and not groups else None
    wait_for(rolled_out, 420, "the single-node revision ready and the LeaderWorkerSet pruned", interval=2)
    served_every_request(load(sandbox, SPANNING, 10, tmp_path), tmp_path)
