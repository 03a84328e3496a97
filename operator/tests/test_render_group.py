"""A replica larger than a node renders as a LeaderWorkerSet (render/group.py), checked against the
LeaderWorkerSet record and the release record; a replica on one node renders as before."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from dataclasses import replace

import pytest

from llmfleet.api import LLMDeployment
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.catalog.release_record import load_release_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.reconcile.canary import _gpus_per_replica
from llmfleet.reconcile.context import Children
from llmfleet.render import RenderError, RenderSettings, group, layout, namespace_prerequisites, render, revision_hash
from llmfleet.render.identity import CHILD_KINDS, COMPONENT_LABEL
from llmfleet_dev.release_checks import check_group_mpirun_command
from render_builders import manifest

LWS = load_lws_record()
RECORD = load_release_record()
SETTINGS = RenderSettings()


def spanning(serving_replicas: int = 3, *, network_policy: bool = False, pool: bool = False, route: bool = False):
    """TP8 PP2 on H100 nodes of 8 GPUs: one replica over two nodes."""
    body = manifest(8)
    if network_policy:
        body["spec"]["networkPolicy"] = {"metricsScrapers": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]}
    if pool or route:
        body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "gateway"}]}, **({"inferencePool": {}} if pool else {})}
    deployment = LLMDeployment.from_manifest(body)
    single = plan(plan_request_from_spec(deployment.spec))
    assert single.nodes_per_replica == 1 and single.tensor_parallel_size == 8
    two_nodes = replace(single, pipeline_parallel_size=2, nodes_per_replica=2)
    objects = render(deployment, two_nodes, revision_hash(deployment.spec, two_nodes), SETTINGS,
                     serving_replicas=serving_replicas)
    return deployment, two_nodes, objects


def the(objects, kind):
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_a_replica_spanning_nodes_is_a_leader_worker_set_of_one_group_per_replica():
    _, _, objects = spanning(serving_replicas=3)
    assert "Deployment" not in [o["kind"] for o in objects]
    workload = the(objects, "LeaderWorkerSet")
    assert workload["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = workload["spec"]
    assert spec["replicas"] == 3  # groups
    group_spec = spec["leaderWorkerTemplate"]
    assert group_spec["size"] == 2  # one pod per node
    # A dead worker recreates its whole group; workers start with their leader.
    assert (group_spec["restartPolicy"], spec["startupPolicy"]) == ("RecreateGroupOnPodRestart", "LeaderCreated")
    written = {"replicas", "startupPolicy"} | {f"leaderWorkerTemplate.{key}" for key in group_spec}
    assert written <= LWS.spec_fields
    assert (LWS.api_version, LWS.kind, LWS.plural) in {(k.api_version, k.kind, k.plural) for k in CHILD_KINDS}


def test_every_pod_of_a_group_holds_one_nodes_share_of_the_gpus():
    _, _, objects = spanning()
    group_spec = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for template in (group_spec["leaderTemplate"], group_spec["workerTemplate"]):
        (container,) = template["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert container["resources"]["requests"]["cpu"] == "32"
        (term,) = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["7"]} in term["matchExpressions"]
    # The engine build is one pod too: one node's GPUs, trtllm-build taking the ranks in turn.
    (build,) = the(objects, "Job")["spec"]["template"]["spec"]["containers"]
    assert build["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_the_leader_runs_the_rank_group_over_its_pods_as_the_recipe_does():
    _, _, objects = spanning()
    leader = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    (server,) = leader["containers"]
    shell, flag, script, name, *mpirun = server["command"]
    assert (shell, flag, name) == ("/bin/bash", "-c", "rank-group")
    # It waits for every pod of its group to run, polling as upstream does, then becomes mpirun.
    assert "$GROUP_PODS" in script and f"sleep {LWS.poll_seconds}" in script and script.endswith('exec "$@"\n')
    assert "$(" not in script  # the kubelet would expand it
    env = {entry["name"]: entry for entry in server["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["GROUP_PODS"]["value"] == "$(POD_NAME) $(POD_NAME)-1"
    assert check_group_mpirun_command(RECORD, LWS, mpirun, "tensorrt_llm", gpus_per_pod=8) == []
    assert mpirun[mpirun.index("--host") + 1] == "$(POD_NAME):8,$(POD_NAME)-1:8"
    assert mpirun[mpirun.index(LWS.rsh_agent_parameter) + 1] == group.RSH_AGENT
    assert mpirun.count("tritonserver") == 16
    # The rsh agent and kubectl come from the operator's image; the leader may use them.
    assert [c["name"] for c in leader["initContainers"]] == ["model-repository", group.LAUNCHER_CONTAINER]
    assert leader["serviceAccountName"] == group.LAUNCHER_SERVICE_ACCOUNT
    assert {"name": group.LAUNCHER_VOLUME, "mountPath": group.LAUNCHER_PATH, "readOnly": True} in server["volumeMounts"]


def test_the_group_check_fails_for_a_single_node_command():
    _, _, objects = spanning()
    (server,) = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    mpirun = server["command"][4:]
    wrong = [arg for arg in mpirun if arg != "--allow-http=false"]
    assert "rank 1: missing --allow-http=false" in check_group_mpirun_command(RECORD, LWS, wrong, "tensorrt_llm", 8)
    problems = check_group_mpirun_command(RECORD, LWS, mpirun, "tensorrt_llm", gpus_per_pod=16)
    assert any("--host" in problem for problem in problems)


def test_workers_idle_with_the_model_and_gpus_and_serve_nothing():
    _, _, objects = spanning()
    group_spec = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    worker, leader = group_spec["workerTemplate"], group_spec["leaderTemplate"]
    assert worker["metadata"]["labels"][COMPONENT_LABEL] == group.WORKER_COMPONENT
    assert "annotations" not in worker["metadata"]  # nothing to scrape
    (container,) = worker["spec"]["containers"]
    assert container["command"] == ["/bin/bash", "-c", group.worker_script(LWS.leader_address_env)]
    assert not {"ports", "readinessProbe", "startupProbe", "livenessProbe", "lifecycle"} & set(container)
    # Its ranks read the model repository and the engine as the leader's do.
    assert worker["spec"]["initContainers"] == leader["spec"]["initContainers"][:1]
    assert "serviceAccountName" not in worker["spec"]


def test_service_budget_pool_and_policy_select_the_leaders_only():
    deployment, two_nodes, objects = spanning(network_policy=True, pool=True)
    group_spec = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    leader = group_spec["leaderTemplate"]["metadata"]["labels"]
    worker = group_spec["workerTemplate"]["metadata"]["labels"]
    selectors = {
        "Service": [s["spec"]["selector"] for s in objects if s["kind"] == "Service"
                    and s["metadata"]["labels"][COMPONENT_LABEL] == "service"],
        "PodDisruptionBudget": [the(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]],
        "InferencePool": [the(objects, "InferencePool")["spec"]["selector"]["matchLabels"]],
        "NetworkPolicy": [the(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]],
    }
    for kind, (selector,) in selectors.items():
        assert selector.items() <= leader.items(), kind
        assert not selector.items() <= worker.items(), kind
    # The group's ranks reach the leader on ports of their own choosing.
    ingress = the(objects, "NetworkPolicy")["spec"]["ingress"]
    assert {"from": [{"podSelector": {"matchLabels": {"llmfleet.io/deployment": "chat"}}}]} in ingress
    # The leaders' ServiceAccount, bound to the chart's role, comes with the namespace.
    kinds = [o["kind"] for o in namespace_prerequisites(deployment, two_nodes, SETTINGS)]
    assert kinds == ["PersistentVolumeClaim", "ServiceAccount", "RoleBinding", "ServiceAccount", "RoleBinding"]


def test_no_rendered_service_takes_the_name_of_the_headless_service_the_leader_worker_set_makes():
    """The LeaderWorkerSet controller creates a headless Service named after the LeaderWorkerSet
    for its groups' DNS (kubernetes-sigs/lws@v0.9.0: pkg/controllers/leaderworkerset_controller.go,
    reconcileHeadlessServices, with the default shared subdomain); a rendered Service of that name
    would be refused or would take the other's place, whichever came second."""
    for route, pool in ((False, False), (True, False), (True, True)):
        _, _, objects = spanning(route=route, pool=pool)
        services = [o["metadata"]["name"] for o in objects if o["kind"] == "Service"]
        assert the(objects, "LeaderWorkerSet")["metadata"]["name"] not in services, (route, pool, services)
        if route and not pool:  # the route's backend is the revision's own Service, rendered beside
            backends = {ref["name"] for ref in the(objects, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]}
            assert backends and backends <= set(services), (backends, services)


def test_a_replica_on_one_node_stays_a_deployment_with_nothing_of_a_group():
    deployment = LLMDeployment.from_manifest(manifest(8))
    single = plan(plan_request_from_spec(deployment.spec))
    objects = render(deployment, single, revision_hash(deployment.spec, single), SETTINGS, serving_replicas=1)
    assert "LeaderWorkerSet" not in [o["kind"] for o in objects]
    assert the(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"][0] == "mpirun"
    assert [o["kind"] for o in namespace_prerequisites(deployment, single, SETTINGS)] == ["PersistentVolumeClaim"]


def test_a_layout_that_does_not_split_into_whole_nodes_is_refused():
    deployment = LLMDeployment.from_manifest(manifest(8))
    single = plan(plan_request_from_spec(deployment.spec))
    uneven = replace(single, tensor_parallel_size=4, pipeline_parallel_size=3, nodes_per_replica=2)
    with pytest.raises(RenderError, match="do not hold equal shares of whole TP4 groups"):
        render(deployment, uneven, "rev", SETTINGS, serving_replicas=1)


def test_the_reconcile_reads_a_groups_replicas_and_gpus():
    _, _, objects = spanning()
    workload = {**the(objects, "LeaderWorkerSet"), "status": {"replicas": 3, "readyReplicas": 2}}
    revision = workload["metadata"]["labels"]["llmfleet.io/revision"]
    children = Children.sorted_from(objects[:1] + [workload])
    assert children.serving[revision] is workload and children.ready(revision) == 2
    assert _gpus_per_replica(workload) == 16


def _stopped_worker(leader_address: str) -> subprocess.Popen:
    """The worker's main process, run by bash as in its container, then sent the kubelet's SIGTERM."""
    worker = subprocess.Popen(["/bin/bash", "-c", group.worker_script(LWS.leader_address_env)],
                              env={"PATH": "/usr/bin:/bin", LWS.leader_address_env: leader_address})
    time.sleep(0.5)
    assert worker.poll() is None, "the worker ended before it was stopped"
    worker.send_signal(signal.SIGTERM)
    return worker


def _leader_address() -> str:
    """An address of its own in 127/8 for the leader, so that nothing else serves its gRPC port."""
    return f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"


def test_a_stopped_worker_stays_while_its_leader_serves_grpc_and_goes_when_it_stops():
    leader_address = _leader_address()
    leader = socket.create_server((leader_address, layout.GRPC_PORT))
    try:
        worker = _stopped_worker(leader_address)
        time.sleep(3)
        assert worker.poll() is None, "the worker went while its leader still served (its ranks with it)"
        # One probe that fails (a busy node, a slow lookup) is not the leader gone.
        leader.close()
        time.sleep(1)
        leader = socket.create_server((leader_address, layout.GRPC_PORT))
        time.sleep(group.LEADER_PROBE_FAILURES + 1)
        assert worker.poll() is None, "the worker went after one failed probe of a leader still serving"
    finally:
        leader.close()
    assert worker.wait(timeout=group.LEADER_PROBE_FAILURES * (1 + group.LEADER_PROBE_TIMEOUT_SECONDS) + 3) == 0


def test_a_stopped_worker_whose_leader_is_gone_goes_after_a_few_probes():
    started = time.monotonic()
    worker = _stopped_worker(_leader_address())
    assert worker.wait(timeout=group.LEADER_PROBE_FAILURES * (1 + group.LEADER_PROBE_TIMEOUT_SECONDS) + 3) == 0
    assert time.monotonic() - started >= group.LEADER_PROBE_FAILURES - 1
