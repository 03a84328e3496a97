"""Replicas that span nodes through the reconcile (issue 29): the autoscaler's count reaches the
LeaderWorkerSet's groups, up and down, and a group that is not ready names the pods of it that
say why, workers included."""

from __future__ import annotations

import re
from datetime import timedelta

from llmfleet.autoscale import MetricsSnapshot
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.planner.cluster import cluster_gpus, gpu_node, gpu_pod
from llmfleet.reconcile import Context
from llmfleet.reconcile.observations import Fleet
from llmfleet.reconcile.observe import observe
from llmfleet.reconcile.pods import not_ready_reason
from llmfleet.render import group
from llmfleet.render.identity import COMPONENT_LABEL, DEPLOYMENT_LABEL, REVISION_LABEL, selector_labels
from cluster_builders import node, pod, product
from reconcile_builders import NOW, SETTINGS, body, by_kind, condition, decide_pass, finished_job, ready_deployment

LWS = load_lws_record()
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def spanning(status: dict | None = None) -> dict:
    """Llama 3.1 405B in BF16: TP8 PP2, one replica a group over two H100 nodes; autoscaled."""
    manifest = body(status=status)
    spec = manifest["spec"]
    spec["model"] = {"name": "llama-3.1-405b", "source": "hf://meta-llama/Llama-3.1-405B-Instruct"}
    spec["slo"] = {"ttftP99Ms": 5000, "tpotP99Ms": 200, "quality": {"allowedQuantizations": ["BF16"]}}
    spec["resources"] = {"allowedGpuTypes": ["H100-SXM-80GB"]}
    spec["workload"]["peakRequestsPerSecond"] = 0.5
    spec["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3}
    return manifest


def metrics(at_seconds: int, ttft_p99_ms: float, requests_per_second: float) -> MetricsSnapshot:
    return MetricsSnapshot(ttft_p99_ms=ttft_p99_ms, waiting_requests=0.0, requests_per_second=requests_per_second,
                           requests_per_second_peak=requests_per_second, kv_cache_utilization=0.1,
                           sample_time=NOW + timedelta(seconds=at_seconds), scrape_interval_seconds=5.0)


def serving_one_group():
    first = decide_pass(spanning(), [], SETTINGS, NOW)
    assert first.status["plan"]["nodesPerReplica"] == 2
    built = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(spanning(first.status), [built], SETTINGS, NOW)
    third = decide_pass(spanning(second.status), [built, ready_deployment(by_kind(second.apply, "LeaderWorkerSet"), 1)],
                        SETTINGS, NOW)
    assert third.status["stableRevision"] == third.status["currentRevision"]
    return third.status, built, ready_deployment(by_kind(third.apply, "LeaderWorkerSet"), 1)


def group_pod(name: str, worker_index: int, group_index: int = 1, **status) -> dict:
    return {"metadata": {"name": name, "labels": {LWS.name_label: "chat-abc", LWS.group_index_label: str(group_index),
                                                  LWS.worker_index_label: str(worker_index)}},
            "status": status}


def pending(name: str, worker_index: int, group_index: int = 1) -> dict:
    return group_pod(name, worker_index, group_index, phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}])


def test_the_autoscalers_count_reaches_the_groups_up_and_down():
    status, built, one = serving_one_group()
    up = decide_pass(spanning(status), [built, one], SETTINGS, NOW + timedelta(seconds=60), metrics(60, 4900.0, 2.0))
    assert up.status["replicas"] == 2 and up.status["autoscaler"]["lastDecision"] == "ScaleUp"
    assert by_kind(up.apply, "LeaderWorkerSet")["spec"]["replicas"] == 2
    assert not [m for m in up.apply if m["kind"] == "Deployment"]
    # The second group's worker cannot be placed: the pass says so while the group starts.
    why = not_ready_reason([group_pod("chat-abc-1", 0, phase="Running"), pending("chat-abc-1-1", 1)])
    starting = decide_pass(spanning(up.status), [built, ready_deployment(by_kind(up.apply, "LeaderWorkerSet"), 1)],
                           SETTINGS, NOW + timedelta(seconds=70), metrics(70, 4900.0, 2.0), not_ready_reason=why)
    progressing = condition(starting, "Progressing")
    assert progressing["reason"] == "ScalingUp" and progressing["message"].endswith(f"1/2 replicas ready; {why}")
    # ... and, the cluster's GPUs read, which nodes lack a part: the first group holds n1 and n2.
    gpus = cluster_gpus([gpu_node(node(name, product("H100-SXM-80GB"))) for name in ("n1", "n2", "n3")],
                        [gpu_pod(pod("serving", name, 8, deployment="chat"), DEPLOYMENT_LABEL) for name in ("n1", "n2")]
                        + [gpu_pod(pod("team", "n3", 4), DEPLOYMENT_LABEL)], "serving", "chat")
    placed = decide_pass(spanning(up.status), [built, ready_deployment(by_kind(up.apply, "LeaderWorkerSet"), 1)],
                         SETTINGS, NOW + timedelta(seconds=70), metrics(70, 4900.0, 2.0), not_ready_reason=why,
                         group_unschedulable=True, cluster_gpus=lambda: gpus)
    assert condition(placed, "Progressing")["message"].endswith(
        f"{why}; nodes for a part of 8 H100-SXM-80GB: no node has 8 free; lacking per node: n1 8, n2 8, n3 4")
    # Idle: after the stabilisation window a whole group goes (the controller removes the last one).
    status, two = up.status, ready_deployment(by_kind(up.apply, "LeaderWorkerSet"), 2)
    for seconds in range(120, 480, 60):
        down = decide_pass(spanning(status), [built, two], SETTINGS, NOW + timedelta(seconds=seconds),
                           metrics(seconds, 300.0, 0.01))
        status = down.status
    assert status["replicas"] == 1 and status["autoscaler"]["lastDecision"] in ("ScaleDown", "Hold")
    assert by_kind(down.apply, "LeaderWorkerSet")["spec"]["replicas"] == 1


def test_a_stuck_worker_is_named_with_its_group_and_every_pod_of_it_that_says_why():
    leader = group_pod("chat-abc-1", 0, phase="Running", conditions=[{"type": "Ready", "status": "False"}],
                       containerStatuses=[{"name": "triton", "ready": False, "state": {"running": {}}}])
    crashing = group_pod("chat-abc-1-2", 2, phase="Running", containerStatuses=[
        {"name": "triton", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}])
    other_group = pending("chat-abc-2-1", 1, group_index=2)
    assert not_ready_reason([leader, pending("chat-abc-1-1", 1), other_group, crashing]) == (
        f"group chat-abc-1, worker 1: pod chat-abc-1-1 is Pending: Unschedulable: {UNSCHEDULABLE}; "
        "worker 2: pod chat-abc-1-2 container triton: CrashLoopBackOff: back-off 40s")
    assert not_ready_reason([pending("chat-abc-1", 0)]).startswith("group chat-abc-1, leader: pod chat-abc-1 is")
    assert not_ready_reason([leader]) is None  # waiting for its workers, which say nothing yet


class PodsGateway:
    """Lists pods by a label selector as the apiserver does: `key=value` and `key in (a,b)` terms."""

    def __init__(self, pods: list[dict]):
        self.pods = pods

    def list_pods(self, namespace, selector):
        def matches(labels: dict, term: str) -> bool:
            if " in (" in term:
                key, values = term.split(" in (")
                return labels.get(key) in values.rstrip(")").split(",")
            key, value = term.split("=")
            return labels.get(key) == value
        terms = re.split(r",(?![^(]*\))", selector)  # the commas between terms, not in a set
        return [pod for pod in self.pods if all(matches(pod["metadata"]["labels"], term) for term in terms)]


def test_the_pass_asks_a_groups_workers_too_not_its_leader_alone():
    status, built, one = serving_one_group()
    revision = status["currentRevision"]
    short = {**one, "status": {"readyReplicas": 0}}

    def labelled(pod: dict, component: str) -> dict:
        pod["metadata"]["labels"].update({**selector_labels("chat"), REVISION_LABEL: revision,
                                          COMPONENT_LABEL: component})
        return pod
    leader = labelled(group_pod("chat-abc-1", 0, phase="Running"), "server")
    worker = labelled(pending("chat-abc-1-1", 1), group.WORKER_COMPONENT)
    seen = observe(Context.of(spanning(status), [built, short], SETTINGS, NOW), PodsGateway([leader, worker]),
                   None, Fleet())
    assert seen.not_ready_reason == (f"group chat-abc-1, worker 1: pod chat-abc-1-1 is Pending: Unschedulable: "
                                     f"{UNSCHEDULABLE}")
    assert seen.group_unschedulable


def canaried(status: dict | None = None, engine_revision: str = "v1", gpu_budget: int = 64) -> dict:
    """The spanning deployment at two groups at least, a new engine revision walked as a canary."""
    manifest = spanning(status)
    manifest["metadata"]["generation"] = {"v1": 3, "v2": 4}[engine_revision]
    manifest["spec"]["engine"] = {"revision": engine_revision}
    manifest["spec"]["rollout"] = {"steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 600}}]}
    manifest["spec"]["resources"]["gpuBudget"] = gpu_budget
    manifest["spec"]["autoscaling"]["minReplicas"] = 2
    return manifest


def test_a_canary_between_two_group_revisions_counts_groups_and_their_gpus():
    first = decide_pass(canaried(), [], SETTINGS, NOW)
    build_v1 = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(canaried(first.status), [build_v1], SETTINGS, NOW)
    stable = ready_deployment(by_kind(second.apply, "LeaderWorkerSet"), 2)
    settled = decide_pass(canaried(second.status), [build_v1, stable], SETTINGS, NOW).status
    assert settled["stableRevision"] == settled["currentRevision"] and settled["replicas"] == 2

    def walked(gpu_budget: int):
        preparing = decide_pass(canaried(settled, "v2", gpu_budget), [build_v1, stable], SETTINGS, NOW)
        build_v2 = finished_job(by_kind(preparing.apply, "Job"))
        return decide_pass(canaried(preparing.status, "v2", gpu_budget), [build_v1, stable, build_v2], SETTINGS,
                           NOW), build_v2
    # 50 % beside two stable groups is two canary groups: 64 GPUs hold them, 48 only one (16 each).
    warming, build_v2 = walked(64)
    canary = by_kind(warming.apply, "LeaderWorkerSet")
    assert canary["metadata"]["name"] != stable["metadata"]["name"]
    assert (warming.status["canary"]["phase"], canary["spec"]["replicas"]) == ("Warming", 2)
    assert by_kind(walked(48)[0].apply, "LeaderWorkerSet")["spec"]["replicas"] == 1
    # The autoscaler's count reaches the stable revision's groups, a replicas-only write.
    up = decide_pass(canaried({**warming.status, "replicas": 3}, "v2"),
                     [build_v1, stable, build_v2, ready_deployment(canary, 2)], SETTINGS, NOW)
    assert [(child["kind"], child["metadata"]["name"], replicas) for child, replicas in up.scale] == [
        ("LeaderWorkerSet", stable["metadata"]["name"], 3)]
