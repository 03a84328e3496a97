"""`llmfleet fleet status`'s report from listed objects (the listing is the Kubernetes API's;
the e2e inventory test reads the command against the sandbox)."""

from __future__ import annotations

from llmfleet.fleet import fleet_status, gpu_inventory
from llmfleet.planner.types import ClusterGpus
from cluster_builders import node, pod, product


def deployment(namespace: str, name: str, **status) -> dict:
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"slo": {"ttftP99Ms": 500}, "resources": {"priorityClassName": "batch"}},
            "status": status}


def test_the_inventory_counts_what_bound_pods_hold_on_ready_schedulable_nodes():
    nodes = [node("a", product("H100-SXM-80GB")), node("b", product("H100-SXM-80GB"), ready=False),
             node("c", product("L40S-48GB")), node("cpu", None)]
    pods = [pod("ns", "a", 2), pod("ns", "c", 8), pod("ns", "b", 4), pod("ns", None, 1)]
    use = {g.gpu_type: (g.nodes, g.allocatable, g.allocatable - g.free) for g in gpu_inventory(nodes, pods).capacities}
    assert use == {"H100-SXM-80GB": (1, 8, 2), "L40S-48GB": (1, 8, 8)}


def test_the_report_shows_each_node_pool_with_the_most_gpus_free_on_one_node():
    h100 = product("H100-SXM-80GB")
    nodes = [node("a", h100, labels={"cloud.google.com/gke-nodepool": "a3"}),
             node("b", h100, labels={"cloud.google.com/gke-nodepool": "a3"}), node("c", h100)]
    gpus = gpu_inventory(nodes, [pod("ns", "a", 4), pod("ns", "b", 4), pod("ns", "c", 1)])
    lines = fleet_status(gpus, [], {}, None).splitlines()
    assert lines[2].split() == ["H100-SXM-80GB", "3", "24", "9", "15"]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["TYPE", "POOL"])
    pools = {line.split()[1]: line.split()[2:] for line in lines[header + 1:lines.index("", header)]}
    # Eight free in the a3 pool, but a replica of more than four fits none of its nodes.
    assert pools == {"cloud.google.com/gke-nodepool=a3": ["2", "16", "8", "8", "4", "0"],
                     f"nvidia.com/gpu.product={h100}": ["1", "8", "1", "7", "7", "0"]}


def test_the_report_counts_whole_free_nodes_and_a_groups_gpus_per_node():
    h100 = product("H100-SXM-80GB")
    gpus = gpu_inventory([node(name, h100) for name in ("a", "b", "c")], [pod("ns", "c", 1)])
    lines = fleet_status(gpus, [deployment("team", "big", replicas=2, plan={
        "summary": "H100x16 BF16", "gpusTotal": 32, "replicas": 2, "nodesPerReplica": 2})], {}, None).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["TYPE", "POOL"])
    # 23 GPUs free, 8 at most on one node, and two whole nodes free: one group of two nodes fits.
    assert lines[header + 1].split()[2:] == ["3", "24", "1", "23", "8", "2"]
    row = next(line.split() for line in lines if line.startswith("  team/big"))
    assert row[4:11] == ["32", "(2", "x", "2", "nodes", "of", "8)"]


def test_the_report_lists_gpus_and_every_deployment_with_what_it_knows():
    gpus = gpu_inventory([node("a", product("L40S-48GB"))], [pod("ns", "a", 4)])
    serving = deployment("team", "chat", replicas=2, readyReplicas=1, ttftP99Ms=231.6,
                         plan={"summary": "L40Sx4 FP8", "gpusTotal": 8},
                         conditions=[{"type": "Planned", "status": "False", "reason": "CapacityShortfall"}],
                         recommendation={"reason": "SloAtRisk", "plan": {"summary": "L40Sx4 FP8", "replicas": 3}})
    waiting = deployment("team", "new")
    report = fleet_status(gpus, [waiting, serving], {("team", "chat"): 0.9871}, 300)
    lines = report.splitlines()
    assert lines[1].split() == ["TYPE", "NODES", "GPUS", "USED", "FREE"]
    assert lines[2].split() == ["L40S-48GB", "1", "8", "4", "4"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  team/")}
    assert rows["team/chat"] == ["team/chat", "batch", "L40Sx4", "FP8", "8", "1/2", "232", "ms", "500", "ms",
                                 "98.7%", "False", "CapacityShortfall", "SloAtRisk:", "L40Sx4", "FP8", "x3"]
    assert rows["team/new"][2:] == ["-", "-", "0/0", "-", "500", "ms", "-", "-", "-"]
    assert "over the last 300 s" in report


def test_without_prometheus_or_gpus_the_report_says_so():
    report = fleet_status(ClusterGpus(), [], {}, None)
    assert "no Prometheus URL given" in report and "no GPU node" in report and "  none" in report
