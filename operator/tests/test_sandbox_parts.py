"""The sandbox's pure pieces, without a cluster: endpoint selection, pod discovery labels,
probe thresholds, pid records. Container roots and images: test_sandbox_rootfs.py."""

from __future__ import annotations

import json
import random

from llmfleet_sandbox.agent import NodeAgent
from llmfleet_sandbox.config import SandboxConfig
from llmfleet_sandbox.poddiscovery import pod_target_groups
from llmfleet_sandbox.podworker import PodWorker
from llmfleet_sandbox.probes import ProbeState
from llmfleet_sandbox.processes import ProcessTable, process_start_ticks
from llmfleet.simulation.routing import LEAST_CONNECTIONS, RANDOM, ROUND_ROBIN
from llmfleet_sandbox.serviceproxy import SCHEDULER_ANNOTATION, EndpointTable, service_scheduler


def _slice(name, service, addresses_ready, port=8001, port_name="grpc", terminating=()):
    return {"metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": port_name, "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {
                "ready": ready, "terminating": address in terminating}}
                for address, ready in addresses_ready]}


def test_service_proxy_balances_over_ready_not_terminating_endpoints():
    # In turn, so that four picks must reach both eligible endpoints (at random, 1 in 8 do not).
    table = EndpointTable(scheduler=ROUND_ROBIN)
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", False),
                                                    ("10.0.0.3", True)], terminating={"10.0.0.3"}))
    table.set_slice("ns", "b", _slice("b", "chat", [("10.0.0.4", True)]))
    table.set_slice("ns", "c", _slice("c", "other", [("10.0.0.9", True)]))
    picks = {table.pick("ns", "chat", "grpc") for _ in range(4)}
    assert picks == {("10.0.0.1", 8001), ("10.0.0.4", 8001)}
    assert table.pick("ns", "chat", "http") is None
    table.set_slice("ns", "a", None)
    assert table.pick("ns", "chat", "grpc") == ("10.0.0.4", 8001)


def test_least_connections_sends_a_new_connection_to_the_least_busy_endpoint():
    table = EndpointTable("least-connections")
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", True), ("10.0.0.3", True)]))
    opened = [table.pick("ns", "chat", "grpc") for _ in range(3)]
    assert sorted(opened) == [("10.0.0.1", 8001), ("10.0.0.2", 8001), ("10.0.0.3", 8001)]  # ties: round robin
    busy, *others = opened
    for backend in others:  # their requests finished; the busy one's connection stays open
        table.closed(backend)
    assert sorted(table.pick("ns", "chat", "grpc") for _ in range(2)) == sorted(others)


def test_by_default_each_connection_goes_to_an_endpoint_at_random_as_kube_proxys_iptables_mode_does():
    table = EndpointTable(random_source=random.Random(3))
    assert table.scheduler == RANDOM
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", True)]))
    picks = [table.pick("ns", "chat", "grpc") for _ in range(200)]
    repeats = sum(a == b for a, b in zip(picks, picks[1:]))
    assert 70 <= picks.count(("10.0.0.1", 8001)) <= 130
    assert 70 <= repeats <= 130  # in turn, none would repeat


def test_round_robin_ignores_open_connections():
    table = EndpointTable(ROUND_ROBIN)
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", True)]))
    picks = [table.pick("ns", "chat", "grpc") for _ in range(4)]  # none closed
    assert picks.count(("10.0.0.1", 8001)) == picks.count(("10.0.0.2", 8001)) == 2


def test_a_services_annotation_chooses_its_own_scheduler():
    table = EndpointTable(ROUND_ROBIN)  # for every Service without the annotation
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", True)]))
    busy = table.pick("ns", "chat", "grpc")  # a connection that stays open

    def short_connection(scheduler):
        backend = table.pick("ns", "chat", "grpc", scheduler)
        table.closed(backend)
        return backend

    assert {short_connection(LEAST_CONNECTIONS) for _ in range(4)} == {("10.0.0.2", 8001)} != {busy}
    assert {short_connection(None) for _ in range(4)} == {busy, ("10.0.0.2", 8001)}
    annotated = {"metadata": {"namespace": "ns", "name": "chat",
                              "annotations": {SCHEDULER_ANNOTATION: LEAST_CONNECTIONS}}}
    assert service_scheduler(annotated) == LEAST_CONNECTIONS
    assert service_scheduler({"metadata": {"namespace": "ns", "name": "chat"}}) is None


def test_an_unknown_scheduler_annotation_is_reported_and_ignored(capsys):
    service = {"metadata": {"namespace": "ns", "name": "chat", "annotations": {SCHEDULER_ANNOTATION: "sticky"}}}
    assert service_scheduler(service) is None
    assert "must be one of random, round-robin, least-connections, got 'sticky'" in capsys.readouterr().out


def test_a_closed_connection_is_no_longer_counted():
    table = EndpointTable("least-connections")
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True)]))
    backend = table.pick("ns", "chat", "grpc")
    assert table.open_connections[backend] == 1
    table.closed(backend)
    assert backend not in table.open_connections


def test_pod_discovery_gives_kubernetes_sd_labels():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                        "labels": {"llmfleet.io/deployment": "chat"},
                        "annotations": {"prometheus.io/scrape": "true"}},
           "spec": {"nodeName": "gpu-node-1", "containers": [
               {"name": "triton", "ports": [{"name": "metrics", "containerPort": 8002}]}]},
           "status": {"podIP": "10.244.1.2", "phase": "Running",
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    [group] = pod_target_groups(pod)
    assert group["targets"] == ["10.244.1.2:8002"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_label_llmfleet_io_deployment"] == "chat"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_ready"] == "true"
    assert pod_target_groups({**pod, "status": {}}) == []


def test_pods_scraped_off_leave_discovery_until_scraped_on(tmp_path):
    from llmfleet_sandbox import faults
    from llmfleet_sandbox.poddiscovery import PodIndex

    def pod(namespace, name):
        return {"metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"},
                "spec": {"containers": [{"name": "triton", "ports": [{"containerPort": 8002}]}]},
                "status": {"podIP": f"10.244.1.{len(name)}", "phase": "Running"}}

    index = PodIndex()
    index.reset([pod("a", "p"), pod("a", "qq"), pod("b", "p")])

    def discovered():
        groups = index.target_groups(faults.unscraped_pods(tmp_path))
        return sorted((g["labels"]["__meta_kubernetes_namespace"], g["labels"]["__meta_kubernetes_pod_name"])
                      for g in groups)

    assert discovered() == [("a", "p"), ("a", "qq"), ("b", "p")]
    faults.set_pod_scraped(tmp_path, "a", "p", scraped=False)
    assert discovered() == [("a", "qq"), ("b", "p")]  # only that namespace's pod of that name
    faults.set_pod_scraped(tmp_path, "a", "p", scraped=True)
    assert discovered() == [("a", "p"), ("a", "qq"), ("b", "p")]


def test_probe_thresholds_flip_only_when_reached():
    state = ProbeState({"failureThreshold": 2, "successThreshold": 1, "periodSeconds": 1}, started_at=0)
    state.record(True, 1)
    assert state.passing is True
    state.record(False, 2)
    assert state.passing is True
    state.record(False, 3)
    assert state.passing is False


def test_probe_ticks_passed_during_startup_delay_the_first_probe_by_a_period():
    readiness = ProbeState({"periodSeconds": 5}, started_at=100)
    assert readiness.due(100)
    readiness.pass_tick(100)
    assert not readiness.due(104)
    assert readiness.due(105)
    assert readiness.passing is None


def test_pid_records_do_not_match_a_reused_pid(tmp_path):
    table = ProcessTable(tmp_path / "pids", tmp_path / "logs")
    record = table.start("sleeper", ["sleep", "30"])
    assert record.alive() and process_start_ticks(record.pid) == record.start_ticks
    forged = type(record)(record.name, record.pid, record.start_ticks + 1)
    assert not forged.alive()
    table.stop("sleeper", grace_seconds=5)
    assert not record.alive()
    assert table.recorded() == []


def test_each_instance_has_its_own_addresses_and_ports(tmp_path):
    import pytest


    default, beside = SandboxConfig(state_dir=tmp_path / "a"), SandboxConfig(state_dir=tmp_path / "b", instance=1)
    assert (default.network.bridge_name, default.apiserver_url, default.prometheus_url) == (
        "llmf0", "https://10.244.0.1:16443", "http://10.244.0.1:19090")
    assert (beside.network.bridge_name, beside.apiserver_url, beside.prometheus_url) == (
        "llmf1", "https://10.245.0.1:16543", "http://10.245.0.1:19190")
    assert (beside.network.service_cidr, beside.network.node_pod_cidr(2)) == ("10.97.0.0/16", "10.245.2.0/24")
    # No port of one instance is a port of another, and the settings file keeps the instance.
    assert not set(vars(default.ports).values()) & set(vars(beside.ports).values())
    assert SandboxConfig.from_dict(beside.to_dict()) == beside
    with pytest.raises(ValueError, match="instance must be within 0..9"):
        SandboxConfig(instance=10)


def test_extra_node_pools_number_their_nodes_after_the_first_pool_and_survive_the_state_file(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, node_count=2, gpu_type="H100-SXM-80GB",
                           extra_node_pools=(("L40S-48GB", 1), ("A100-SXM-80GB", 2)))
    assert config.gpu_node_types() == {"gpu-node-1": "H100-SXM-80GB", "gpu-node-2": "H100-SXM-80GB",
                                       "gpu-node-3": "L40S-48GB", "gpu-node-4": "A100-SXM-80GB",
                                       "gpu-node-5": "A100-SXM-80GB"}
    assert config.node_names()[-1] == "cpu-node-1"
    assert SandboxConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_an_agent_labels_each_node_with_its_pools_gpu(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, node_count=1, extra_node_pools=(("L40S-48GB", 1),))
    agent = NodeAgent.__new__(NodeAgent)  # only its node rendering, no cluster
    agent.config, agent.nodes = config, config.node_names()
    products = {name: agent.node_manifest(name)["metadata"]["labels"].get("nvidia.com/gpu.product")
                for name in config.node_names()}
    assert products == {"gpu-node-1": "NVIDIA-H100-80GB-HBM3", "gpu-node-2": "NVIDIA-L40S", "cpu-node-1": None}


class _FullNodeAgent:
    """Just what a pod worker asks of its agent before it runs anything: a node whose GPUs are
    all taken, and a Kubernetes client that records status patches."""

    def __init__(self, config):
        self.config, self.patches, self.released, self.finished = config, [], [], []
        self.core = self

    def allocate_gpus(self, node_name, uid, count):
        return []

    def patch_namespaced_pod_status(self, name, namespace, body):
        self.patches.append((namespace, name, body))

    def release(self, node_name, uid):
        self.released.append(uid)

    def pod_worker_finished(self, worker):
        self.finished.append(worker.uid)

    def log(self, message):
        pass


def test_a_pod_whose_gpus_are_taken_fails_admission_as_the_kubelet_does_and_runs_nothing(tmp_path):
    agent = _FullNodeAgent(SandboxConfig(state_dir=tmp_path))
    pod = {"metadata": {"name": "urgent-0", "namespace": "ns", "uid": "uid-1"},
           "spec": {"nodeName": "gpu-node-1", "containers": [
               {"name": "triton", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    worker = PodWorker(agent, pod)
    worker.run()
    ((namespace, name, body),) = agent.patches
    assert (namespace, name, body["status"]["phase"], body["status"]["reason"]) == \
           ("ns", "urgent-0", "Failed", "UnexpectedAdmissionError")
    assert "Requested: 4, Available: 0" in body["status"]["message"]
    assert agent.released == agent.finished == ["uid-1"] and worker.pod_ip is None
