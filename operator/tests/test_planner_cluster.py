"""The planner on a known cluster: GPU types it lacks are never chosen, a replica's GPUs share
one node, and a plan that needs more replicas than the free GPUs hold says so, node by node, and
serves what fits now."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from llmfleet.catalog import load_catalog
from llmfleet.planner import PlanRequest, SearchSpace, SloTargets, Workload, plan
from llmfleet.planner.cluster import GPU_POD_FIELD_SELECTOR, cluster_gpus, gpu_node, gpu_pod
from llmfleet.planner.types import ClusterGpus, NodeGpus
from llmfleet.reconcile import OperatorSettings
from reconcile_builders import decide_pass
from llmfleet.render import RenderSettings
from llmfleet.render.identity import DEPLOYMENT_LABEL
from cluster_builders import node, pod, product
from reconcile_builders import NOW, body, by_kind, condition, finished_job, ready_deployment

CATALOG = load_catalog()
H100, L40S, B200 = "H100-SXM-80GB", "L40S-48GB", "B200-180GB"
CHAT = Workload(input_tokens_mean=1000, input_tokens_p99=4000, output_tokens_mean=200, output_tokens_p99=800,
                peak_requests_per_sec=5)


def cluster(*capacities: tuple[str, int, int], gpus_per_node: int = 8) -> ClusterGpus:
    """Per (GPU type, GPUs, free GPUs): nodes of `gpus_per_node` (the last takes the rest), free
    GPUs filling whole nodes first, so that where the GPUs are is no constraint."""
    nodes = []
    for gpu_type, allocatable, free in capacities:
        for index, first_gpu in enumerate(range(0, allocatable, gpus_per_node)):
            gpus = min(gpus_per_node, allocatable - first_gpu)
            nodes.append(NodeGpus(f"{gpu_type.split('-')[0].lower()}-{index}", gpu_type, "pool", gpus,
                                  max(0, min(gpus, free - first_gpu))))
    return ClusterGpus(tuple(nodes))


def on_nodes(gpu_type: str, *free_per_node: int, gpus_per_node: int = 8) -> ClusterGpus:
    """Nodes n1, n2, ... of `gpu_type` with these free GPUs each."""
    return ClusterGpus(tuple(NodeGpus(f"n{index}", gpu_type, "pool", gpus_per_node, free)
                             for index, free in enumerate(free_per_node, start=1)))


def by_node(gpus: ClusterGpus) -> dict[str, tuple[str, int, int]]:
    return {n.node: (n.gpu_type, n.allocatable, n.free) for n in gpus.nodes}


def request(gpu_types=(H100, L40S, B200), cluster_gpus=None, model="llama-3.1-8b", workload=CHAT,
            **space) -> PlanRequest:
    return PlanRequest(CATALOG.model(model), workload, SloTargets(1000, 50),
                       SearchSpace(gpu_types=gpu_types, cluster_gpus=cluster_gpus, **space))


def test_nodes_count_by_product_only_while_ready_and_schedulable():
    assert gpu_node(node("cpu", None)) is None
    assert gpu_node(node("a", product(H100))).schedulable
    assert not gpu_node(node("b", product(H100), ready=False)).schedulable
    assert not gpu_node(node("c", product(H100), unschedulable=True)).schedulable
    nodes = [gpu_node(n) for n in (node("a", product(H100)), node("b", product(H100), ready=False),
                                   node("c", product(L40S), gpus=4), node("d", "NVIDIA-Unknown-Board"))]
    assert by_node(cluster_gpus(nodes, [], "ns", "chat")) == {"a": (H100, 8, 8), "c": (L40S, 4, 4)}


def test_pods_hold_gpus_only_while_bound_and_not_finished_and_init_containers_as_the_scheduler_counts():
    assert gpu_pod(pod("ns", None, 2), DEPLOYMENT_LABEL) is None  # pending, not bound
    assert gpu_pod(pod("ns", "a", 2, phase="Succeeded"), DEPLOYMENT_LABEL) is None
    assert gpu_pod(pod("ns", "a", 0), DEPLOYMENT_LABEL) is None
    assert gpu_pod(pod("ns", "a", 2, init_gpus=4), DEPLOYMENT_LABEL).gpus == 4
    assert gpu_pod(pod("ns", "a", 2, deployment="chat"), DEPLOYMENT_LABEL).deployment == "chat"


def test_free_gpus_leave_out_other_workloads_but_not_the_deployments_own_pods():
    nodes = [gpu_node(node("a", product(H100))), gpu_node(node("b", product(H100)))]
    pods = [gpu_pod(p, DEPLOYMENT_LABEL) for p in (pod("ns", "a", 2, deployment="chat"),      # its own: replaced by a plan
                                        pod("ns", "a", 4, deployment="other"),
                                        pod("team", "b", 8),
                                        pod("ns", "b", 1, deployment="chat", phase="Failed"))]
    assert by_node(cluster_gpus(nodes, [p for p in pods if p], "ns", "chat")) == {"a": (H100, 8, 4), "b": (H100, 8, 0)}
    assert by_node(cluster_gpus(nodes, [p for p in pods if p], "other-ns", "chat")) == {"a": (H100, 8, 2),
                                                                                      "b": (H100, 8, 0)}


def test_the_deployments_own_gpus_are_free_for_its_plan_but_not_for_a_pod_it_adds_now():
    nodes = [gpu_node(node(name, product(H100))) for name in ("a", "b")]
    pods = [gpu_pod(pod("ns", "a", 8, deployment="chat"), DEPLOYMENT_LABEL),
            gpu_pod(pod("ns", "b", 2, deployment="other"), DEPLOYMENT_LABEL)]
    gpus = cluster_gpus(nodes, pods, "ns", "chat")
    assert by_node(gpus) == {"a": (H100, 8, 8), "b": (H100, 8, 6)}
    assert gpus.free_now(H100) == (("a", 0), ("b", 6))


def test_gpus_of_lower_priority_pods_count_as_free_for_they_are_preempted():
    nodes = [gpu_node(node("a", product(L40S)))]
    batch = dict(pod("ns", "a", 4, deployment="batch"))
    batch["spec"] = {**batch["spec"], "priority": 100}
    other = dict(pod("ns", "a", 2, deployment="other"))
    other["spec"] = {**other["spec"], "priority": 1000}
    pods = [gpu_pod(batch, DEPLOYMENT_LABEL), gpu_pod(other, DEPLOYMENT_LABEL)]
    assert by_node(cluster_gpus(nodes, pods, "ns", "urgent", priority=1000)) == {"a": (L40S, 8, 6)}
    assert by_node(cluster_gpus(nodes, pods, "ns", "urgent", priority=100)) == {"a": (L40S, 8, 2)}
    assert by_node(cluster_gpus(nodes, pods, "ns", "urgent")) == {"a": (L40S, 8, 2)}


def test_without_a_cluster_the_cheapest_allowed_type_wins_and_with_one_only_types_it_has():
    offline = plan(request())
    assert offline.feasible and offline.gpu_type == L40S  # not in the cluster below: pods would stay Pending
    on_cluster = plan(request(cluster_gpus=cluster((H100, 16, 16))))
    assert on_cluster.feasible and on_cluster.gpu_type == H100
    lacking = [r for r in on_cluster.rejected if r.reason.startswith("cluster: ")]
    assert lacking and all(re.fullmatch(r"cluster: 0 (L40S-48GB|B200-180GB) are schedulable; the cluster has "
                                        r"H100-SXM-80GB x16 \(16 free, at most 8 on one node\)", r.reason)
                           for r in lacking), lacking


def test_a_spec_that_fits_only_a_type_the_cluster_has_lands_there():
    result = plan(request(gpu_types=(B200, L40S), cluster_gpus=cluster((H100, 16, 16), (L40S, 8, 8))))
    assert result.feasible and result.gpu_type == L40S and result.shortfall is None


def test_no_allowed_type_in_the_cluster_is_infeasible_and_names_what_it_has():
    result = plan(request(gpu_types=(B200,), cluster_gpus=cluster((H100, 16, 16))))
    assert not result.feasible
    assert "cluster" in result.rationale[0]


# The sandbox demo's shape at 3 requests/s: 70B in 8-sequence batches, two replicas of one H100
# each, where an L40S replica needs four GPUs.
BIG = {"model": "llama-3.1-70b", "workload": Workload(256, 512, 64, 128, 3), "max_batch_size": 8}


def _slo_plan(**kwargs):
    result = plan(request(cluster_gpus=cluster((H100, 64, 64), (L40S, 64, 64)), **kwargs))
    assert result.feasible and result.shortfall is None
    return result


def test_when_the_slo_plan_does_not_fit_the_free_gpus_another_type_that_meets_it_is_served():
    wanted = _slo_plan(gpu_types=(H100, L40S), **BIG)
    assert wanted.gpu_type == H100
    result = plan(request(gpu_types=(H100, L40S), cluster_gpus=cluster((H100, 64, 0), (L40S, 64, 64)), **BIG))
    assert result.feasible and result.gpu_type == L40S and result.shortfall is None
    assert (f"would need {wanted.replicas} replicas of {wanted.tensor_parallel_size} GPUs; the free H100-SXM-80GB "
            f"hold 0 replica(s)") in result.rationale[-1]


def test_a_shortfall_serves_the_slo_plans_configuration_on_the_gpus_free_and_says_how_many_more():
    wanted = _slo_plan(gpu_types=(H100,), **BIG)
    per_replica = wanted.gpus_total // wanted.replicas
    assert wanted.replicas >= 2, "the case needs a plan of several replicas"
    free = per_replica * (wanted.replicas - 1)
    result = plan(request(gpu_types=(H100,), cluster_gpus=cluster((H100, 64, free)), **BIG))
    assert (result.gpu_type, result.tensor_parallel_size, result.quantization) == \
           (wanted.gpu_type, wanted.tensor_parallel_size, wanted.quantization)
    assert result.replicas == wanted.replicas - 1
    assert result.shortfall is not None
    assert result.shortfall.gpus_needed == wanted.gpus_total and result.shortfall.gpus_free == free
    assert f"1 more replica(s) need {per_replica} free H100-SXM-80GB on one node each" in result.shortfall.message
    assert result.to_json_dict()["capacityShortfall"] == result.shortfall.message


def test_an_slo_plan_larger_than_the_cluster_is_a_shortfall_not_a_refusal():
    wanted = _slo_plan(gpu_types=(H100,), **BIG)
    per_replica = wanted.gpus_total // wanted.replicas
    small = per_replica * (wanted.replicas - 1)  # the whole cluster holds one replica fewer
    result = plan(request(gpu_types=(H100,), cluster_gpus=cluster((H100, small, small)), **BIG))
    assert result.feasible and result.replicas == wanted.replicas - 1
    assert f"but {small} of the cluster's {small} H100-SXM-80GB are free" in result.shortfall.message


def test_with_no_gpu_free_the_slo_plan_waits_for_gpus_and_says_so():
    wanted = _slo_plan(gpu_types=(H100,), **BIG)
    result = plan(request(gpu_types=(H100,), cluster_gpus=cluster((H100, 64, 0)), **BIG))
    assert replace(result, shortfall=None, rationale=()) == replace(wanted, rationale=())
    assert result.shortfall.gpus_free == 0 and "wait for GPUs" in result.rationale[-1]


def test_pinned_replicas_are_kept_beyond_the_free_gpus():
    result = plan(request(gpu_types=(H100,), pinned_replicas=4, cluster_gpus=cluster((H100, 64, 2))))
    assert result.replicas == 4 and result.shortfall is not None


@pytest.mark.parametrize("free, expected", [(16, "True"), (0, "False")])
def test_the_planned_condition_says_capacity_shortfall_and_ready_does_not_depend_on_it(free, expected):
    gpus = cluster((H100, 16, free))
    outcome = decide_pass(body(), [], OperatorSettings(render=RenderSettings()), NOW, cluster_gpus=lambda: gpus)
    planned = condition(outcome, "Planned")
    assert planned["status"] == expected
    if expected == "False":
        assert planned["reason"] == "CapacityShortfall"
        assert "but 0 of the cluster's 16 H100-SXM-80GB are free" in planned["message"]
        assert "free per node: h100-0 0, h100-1 0" in planned["message"]
        assert "llmfleet.io/replan" in planned["message"]
        assert outcome.status["plan"]["capacityShortfall"] and outcome.apply  # it still renders what fits
    else:
        assert "capacityShortfall" not in outcome.status["plan"]
    # What fits is built and served: once a replica is ready, the deployment is Ready.
    settings = OperatorSettings(render=RenderSettings())
    built = finished_job(by_kind(outcome.apply, "Job"))
    rolling = decide_pass(body(status=outcome.status), [built], settings, NOW, cluster_gpus=lambda: gpus)
    serving = ready_deployment(by_kind(rolling.apply, "Deployment"), rolling.status["replicas"])
    served = decide_pass(body(status=rolling.status), [built, serving], settings, NOW, cluster_gpus=lambda: gpus)
    ready = condition(served, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    assert ("(Planned False: CapacityShortfall)" in ready["message"]) == (expected == "False")


def test_a_stored_plan_does_not_ask_for_the_cluster():
    first = decide_pass(body(), [], OperatorSettings(render=RenderSettings()), NOW)

    def never():
        raise AssertionError("the cluster was asked although the plan is stored")

    again = decide_pass(body(status=first.status), [], OperatorSettings(render=RenderSettings()), NOW, cluster_gpus=never)
    assert again.status["plan"] == first.status["plan"]


def _selected(pod: dict, field_selector: str) -> bool:
    """The API's reading of a selector of `path!=value` terms (all must hold; a missing field is "")."""
    def field(path: str) -> str:
        value = pod
        for key in path.split("."):
            value = (value or {}).get(key)
        return value or ""
    terms = [term.split("!=") for term in field_selector.split(",")]
    assert all(len(term) == 2 for term in terms), field_selector
    return all(field(path) != value for path, value in terms)


@pytest.mark.parametrize("node", [None, "gpu-node-1"])
@pytest.mark.parametrize("phase", [None, "Pending", "Running", "Succeeded", "Failed", "Unknown"])
def test_the_pods_watch_selects_every_pod_that_holds_gpus_and_no_unbound_or_finished_one(node, phase):
    pod = {"metadata": {"name": "p", "namespace": "serving", "labels": {}},
           "spec": {**({"nodeName": node} if node else {}),
                    "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
           "status": {"phase": phase} if phase else {}}
    holds = gpu_pod(pod, "llmfleet.io/deployment") is not None
    assert _selected(pod, GPU_POD_FIELD_SELECTOR) == holds


def test_a_tp8_replica_is_never_placed_across_two_nodes_with_four_free_gpus_each():
    nodes = [gpu_node(node(name, product(H100))) for name in ("n1", "n2")]
    pods = [gpu_pod(pod("team", name, 4), DEPLOYMENT_LABEL) for name in ("n1", "n2")]
    result = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=8,
                          cluster_gpus=cluster_gpus(nodes, pods, "ns", "chat")))
    assert result.tensor_parallel_size == 8 and result.shortfall is not None
    assert "8 free H100-SXM-80GB on one node" in result.shortfall.message
    assert result.shortfall.message.endswith("free per node: n1 4, n2 4")


def test_a_tp8_replica_plans_on_a_node_with_eight_free_beside_one_with_four():
    result = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=8, cluster_gpus=on_nodes(H100, 4, 8)))
    assert result.tensor_parallel_size == 8 and result.replicas == 1 and result.shortfall is None
    assert result.rationale[-1] == ("placement: 1 replica(s) of 8 GPUs, each on one node; replicas the free "
                                    "H100-SXM-80GB hold per node: n2 1")


def test_replicas_bin_pack_over_nodes_and_count_only_whole_replicas_on_one_node():
    # 17 free GPUs, 16 needed for four TP4 replicas, yet the nodes hold three: 2 + 1 + 0.
    nodes = on_nodes(H100, 8, 6, 3)
    three = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=4, pinned_replicas=3, cluster_gpus=nodes))
    assert three.shortfall is None and three.rationale[-1].endswith("hold per node: n1 2, n2 1")
    four = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=4, pinned_replicas=4, cluster_gpus=nodes))
    assert four.replicas == 4 and four.shortfall is not None
    assert (four.shortfall.gpus_free, four.shortfall.gpus_needed, four.shortfall.replicas_fitting) == (17, 16, 3)
    assert four.shortfall.message.endswith("1 more replica(s) need 4 free H100-SXM-80GB on one node each; "
                                           "free per node: n1 8, n2 6, n3 3")


def test_a_replica_larger_than_every_node_is_refused_naming_the_nodes():
    result = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=8,
                          cluster_gpus=on_nodes(H100, 4, 4, gpus_per_node=4)))
    assert not result.feasible and result.rationale[0] == "no configuration fits: cluster"
    assert {r.reason for r in result.rejected} == {
        "cluster: a replica needs 8 schedulable H100-SXM-80GB on one node; schedulable per node: n1 4, n2 4"}


def test_the_free_gpus_serve_the_replicas_that_fit_whole_on_nodes_until_more_do():
    wanted = _slo_plan(gpu_types=(H100,), pinned_tensor_parallel_size=2, **BIG)
    assert wanted.replicas >= 2, "the case needs a plan of several replicas"
    # One GPU free on every node: as many GPUs as the plan needs, none holding a TP2 replica but one.
    nodes = on_nodes(H100, 2, *[1] * (wanted.gpus_total - 2))
    result = plan(request(gpu_types=(H100,), pinned_tensor_parallel_size=2, cluster_gpus=nodes, **BIG))
    assert result.replicas == 1 and result.shortfall.replicas_fitting == 1
    assert result.shortfall.gpus_free == wanted.gpus_total
    assert "(free per node: n1 2, n2 1" in result.rationale[-1]
    assert result.rationale[-1].endswith(f"until {wanted.replicas - 1} more fit")


def test_a_node_pool_is_its_provisioners_label_else_its_gpu_product():
    gke = node("a", product(H100), labels={"cloud.google.com/gke-nodepool": "a3-mega"})
    karpenter_on_gke = node("b", product(H100), labels={"cloud.google.com/gke-nodepool": "x",
                                                          "karpenter.sh/nodepool": "gpu"})
    assert gpu_node(gke).pool == "cloud.google.com/gke-nodepool=a3-mega"
    assert gpu_node(karpenter_on_gke).pool == "karpenter.sh/nodepool=gpu"
    assert gpu_node(node("c", product(H100))).pool == f"nvidia.com/gpu.product={product(H100)}"
    gpus = cluster_gpus([gpu_node(n) for n in (gke, node("d", product(H100), labels={
        "cloud.google.com/gke-nodepool": "a3-mega"}), node("e", product(L40S)))],
        [gpu_pod(pod("team", "a", 6), DEPLOYMENT_LABEL)], "ns", "chat")
    pools = {key: (c.nodes, c.allocatable, c.free, c.most_free_on_one_node) for key, c in gpus.pools().items()}
    assert pools == {(H100, "cloud.google.com/gke-nodepool=a3-mega"): (2, 16, 10, 8),
                     (L40S, f"nvidia.com/gpu.product={product(L40S)}"): (1, 8, 8, 8)}


def spanning(pinned_replicas: int | None, cluster_gpus: ClusterGpus):
    """Llama 3.1 405B in BF16: a TP8 PP2 replica over two H100 nodes of eight."""
    small = Workload(input_tokens_mean=128, input_tokens_p99=256, output_tokens_mean=32, output_tokens_p99=64,
                     peak_requests_per_sec=0.5)
    return plan(PlanRequest(CATALOG.model("llama-3.1-405b"), small, SloTargets(5000, 200), SearchSpace(
        gpu_types=(H100,), quantizations=("BF16",), pinned_replicas=pinned_replicas, cluster_gpus=cluster_gpus)))


def test_a_group_spanning_two_nodes_needs_two_nodes_with_a_part_free_not_sixteen_gpus_anywhere():
    # 20 GPUs free, enough for one group but not two, whose four parts need four free nodes.
    result = spanning(2, on_nodes(H100, 8, 8, 4, 0))
    assert (result.nodes_per_replica, result.replicas, result.shortfall.replicas_fitting) == (2, 2, 1)
    assert result.shortfall.message.endswith(
        "(32 GPUs, 16 per replica over 2 nodes of 8) but 20 of the cluster's 32 H100-SXM-80GB are free and hold 1 "
        "replica(s): 1 more replica(s) need 2 nodes with 8 free H100-SXM-80GB each; 4 nodes with 8 free are needed "
        "and 2 have them (n1 8, n2 8); lacking per node: n4 8, n3 4")
    assert result.rationale[-1].startswith("the free H100-SXM-80GB hold 1 replica(s) of 16 GPUs over 2 nodes of 8")
    # Sixteen free, eight on each of two nodes... or four on each of four: only the first holds a group.
    assert spanning(1, on_nodes(H100, 8, 8)).shortfall is None
    apart = spanning(1, on_nodes(H100, 4, 4, 4, 4))
    assert apart.shortfall.replicas_fitting == 0
    assert apart.shortfall.message.endswith("0 have them; lacking per node: n1 4, n2 4, n3 4, n4 4")


def test_a_lower_priority_group_frees_whole_nodes_for_a_group_and_a_peer_pod_does_not():
    nodes = [gpu_node(node(name, product(H100))) for name in ("n1", "n2", "n3")]

    def at(priority: int, deployment: str, on_node: str) -> dict:
        held = dict(pod("ns", on_node, 8, deployment=deployment))
        held["spec"] = {**held["spec"], "priority": priority}
        return held
    # A batch group (leader and worker) on n1 and n2, a peer's single-node replica on n3.
    pods = [gpu_pod(p, DEPLOYMENT_LABEL) for p in (at(100, "batch", "n1"), at(100, "batch", "n2"),
                                                   at(1000, "peer", "n3"))]
    urgent = spanning(1, cluster_gpus(nodes, pods, "ns", "urgent", priority=1000))
    assert urgent.shortfall is None and urgent.rationale[-1].endswith("free per node: n1 8, n2 8, n3 0")
    equal = spanning(1, cluster_gpus(nodes, pods, "ns", "urgent", priority=100))
    assert equal.shortfall.message.endswith("2 nodes with 8 free are needed and 0 have them; "
                                            "lacking per node: n1 8, n2 8, n3 8")


def test_pinned_groups_count_their_gpus_against_the_budget_and_the_nodes():
    over = plan(PlanRequest(CATALOG.model("llama-3.1-405b"), Workload(128, 256, 32, 64, 0.5), SloTargets(5000, 200),
                            SearchSpace(gpu_types=(H100,), quantizations=("BF16",), pinned_replicas=2, gpu_budget=16)))
    assert not over.feasible
    assert ("gpu-budget: 2 pinned replicas need 32 GPUs (16 each over 2 nodes of 8), budget is 16"
            in {r.reason for r in over.rejected})
    within = plan(PlanRequest(CATALOG.model("llama-3.1-405b"), Workload(128, 256, 32, 64, 0.5), SloTargets(5000, 200),
                              SearchSpace(gpu_types=(H100,), quantizations=("BF16",), pinned_replicas=2, gpu_budget=32)))
    assert within.feasible and within.gpus_total == 32
