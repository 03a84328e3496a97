"""The sandbox node agent: fake GPU nodes whose pods run as real local processes.

It plays the kubelet for every sandbox node: registers the Node with GPU
capacity and GPU Feature Discovery labels, renews its Lease, watches pods bound
to it and hands each to a PodWorker. Run as `python -m llmfleet_sandbox.agent`.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import signal
import sys
import threading
import time

import urllib3
from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from llmfleet.gpu_discovery import GPU_RESOURCE
from llmfleet_sandbox import faults, gpus, network
from llmfleet_sandbox.config import SANDBOX_LABEL, SandboxConfig
from llmfleet_sandbox.informer import each_object, watch_forever
from llmfleet_sandbox.podworker import PodWorker, rfc3339

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
LEASE_RENEW_SECONDS = 5
NODE_STATUS_SECONDS = 30
POWER_POLL_SECONDS = 1
# Every sandbox node looks like a GPU server to the scheduler; pods do not
# really get these CPUs, they share the machine.
NODE_CPU = "64"
NODE_MEMORY = "512Gi"
NODE_MAX_PODS = "110"
# `sandbox down` bounds each pod's grace period so that it finishes promptly.
SHUTDOWN_GRACE_SECONDS = 5
# How long a pod's final delete is retried while the apiserver is unreachable (restarting).
FINAL_DELETE_RETRY_SECONDS = 300
# A node's pod watch ends after this and is listed afresh, as the kubelet resyncs its pods every
# minute: a watch that stalls delivers nothing and says nothing, so a pod bound meanwhile would
# wait for the server to close it. The read timeout catches a stream the server went silent on.
POD_WATCH_SECONDS = 60
POD_WATCH_READ_TIMEOUT_SECONDS = 90
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


class NodeAgent:
    """The sandbox's nodes and their pods; each PodWorker reaches it as its `NodeServices`."""

    def __init__(self, config: SandboxConfig, kubernetes_version: str):
        self.config = config
        self.kubernetes_version = kubernetes_version
        kube_config.load_kube_config(str(config.admin_kubeconfig))
        self.core = client.CoreV1Api()
        self.coordination = client.CoordinationV1Api()
        self.host_ip = config.network.gateway_ip
        self.nodes = config.node_names()
        self.lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}
        self.finished_uids: set[str] = set()
        self.ip_by_uid: dict[str, str] = {}
        self.gpus_by_uid: dict[str, tuple[str, list[int]]] = {}
        self.stopping = threading.Event()
        # Nodes whose power is off (`llmfleet sandbox node-power off`): no heartbeat, no pods run.
        self.powered_off = faults.powered_off_nodes(config.state_dir) & set(self.nodes)

    # -- logging and events ---------------------------------------------------------------

    def log(self, message: str) -> None:
        print(f"{datetime.datetime.now().isoformat(timespec='seconds')} {message}", flush=True)

    def event(self, pod: dict, kind: str, reason: str, message: str) -> None:
        metadata = pod["metadata"]
        now = datetime.datetime.now(datetime.timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{metadata['name']}."),
            involved_object=client.V1ObjectReference(
                kind="Pod", name=metadata["name"], namespace=metadata["namespace"],
                uid=metadata["uid"], api_version="v1"),
            reason=reason, message=message, type=kind,
            source=client.V1EventSource(component="llmfleet-node-agent", host=pod["spec"]["nodeName"]),
            first_timestamp=now, last_timestamp=now, count=1,
        )
        try:
            self.core.create_namespaced_event(metadata["namespace"], body)
        except ApiException as error:
            self.log(f"event {reason} for {metadata['name']} not recorded: {error.reason}")
        except (urllib3.exceptions.HTTPError, OSError) as error:  # the apiserver is down: a pod goes on
            self.log(f"event {reason} for {metadata['name']} not recorded: {error!r}")

    # -- object reads for pods ------------------------------------------------------------

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        return self.core.read_namespaced_config_map(name, namespace).data or {}

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        data = self.core.read_namespaced_secret(name, namespace).data or {}
        return {key: base64.b64decode(value).decode() for key, value in data.items()}

    # -- pod IPs and GPUs -----------------------------------------------------------------

    def node_pod_cidr(self, node_name: str) -> ipaddress.IPv4Network:
        index = self.nodes.index(node_name) + 1
        return ipaddress.ip_network(self.config.network.node_pod_cidr(index))

    def allocate_pod_ip(self, node_name: str, uid: str) -> str:
        with self.lock:
            if uid in self.ip_by_uid:
                return self.ip_by_uid[uid]
            used = set(self.ip_by_uid.values())
            for host in list(self.node_pod_cidr(node_name).hosts())[1:]:
                if str(host) not in used:
                    self.ip_by_uid[uid] = str(host)
                    return str(host)
        raise RuntimeError(f"node {node_name} has no free pod IP")

    def allocate_gpus(self, node_name: str, uid: str, count: int) -> list[int]:
        if count == 0:
            return []
        with self.lock:
            used = {i for node, indices in self.gpus_by_uid.values() if node == node_name
                    for i in indices}
            free = [i for i in range(self.config.gpus_per_node) if i not in used]
            # The scheduler never binds more GPUs than a node has; this is a guard.
            indices = free[:count]
            self.gpus_by_uid[uid] = (node_name, indices)
            return indices

    def release(self, node_name: str, uid: str) -> None:
        with self.lock:
            self.ip_by_uid.pop(uid, None)
            self.gpus_by_uid.pop(uid, None)

    def pod_worker_finished(self, worker: PodWorker) -> None:
        with self.lock:
            self.workers.pop(worker.uid, None)
            if not worker.crashed:  # a crashed worker's pod gets a new one at the next relist
                self.finished_uids.add(worker.uid)

    def delete_pod_object(self, namespace: str, name: str, uid: str) -> None:
        """Finish a graceful deletion the way the kubelet does: delete with grace 0, retried
        while the apiserver cannot be reached (else the pod would stay Terminating for good)."""
        deadline = time.monotonic() + FINAL_DELETE_RETRY_SECONDS
        while True:
            try:
                self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0,
                    body=client.V1DeleteOptions(grace_period_seconds=0,
                                                preconditions=client.V1Preconditions(uid=uid)))
                return
            except ApiException as error:
                if error.status not in (404, 409):
                    self.log(f"final delete of {namespace}/{name} failed: {error.reason}")
                return
            except (urllib3.exceptions.HTTPError, OSError) as error:
                if time.monotonic() > deadline or self.stopping.is_set():
                    self.log(f"final delete of {namespace}/{name} gave up: {error!r}")
                    return
                time.sleep(2)

    # -- nodes ----------------------------------------------------------------------------

    def _is_gpu_node(self, node_name: str) -> bool:
        return node_name in self.config.gpu_node_names()

    def node_manifest(self, node_name: str) -> dict:
        gpu_node = self._is_gpu_node(node_name)
        gpu = gpus.gfd_labels(self.config.gpu_node_types()[node_name], self.config.gpus_per_node) if gpu_node else {}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name,
                "labels": {
                    "kubernetes.io/hostname": node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    SANDBOX_LABEL: "true",
                    **gpu,
                },
            },
            "spec": {"podCIDR": str(self.node_pod_cidr(node_name)),
                     "podCIDRs": [str(self.node_pod_cidr(node_name))],
                     "taints": [GPU_TAINT] if gpu_node else []},
        }

    def node_status(self, node_name: str) -> dict:
        now = rfc3339()
        capacity = {"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": NODE_MAX_PODS, "ephemeral-storage": "1Ti"}
        if self._is_gpu_node(node_name):
            capacity[GPU_RESOURCE] = str(self.config.gpus_per_node)
        healthy = [("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                   ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                   ("PIDPressure", "False", "KubeletHasSufficientPID"),
                   ("Ready", "True", "KubeletReady")]
        return {"status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": kind, "status": status, "reason": reason,
                            "message": "llmfleet sandbox node agent is running",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}
                           for kind, status, reason in healthy],
            "addresses": [{"type": "InternalIP", "address": self.host_ip}],
            "nodeInfo": {
                "kubeletVersion": self.kubernetes_version,
                "kubeProxyVersion": self.kubernetes_version,
                "containerRuntimeVersion": "llmfleet-sandbox://0.1.0",
                "operatingSystem": "linux", "architecture": "amd64",
                "osImage": "llmfleet sandbox", "kernelVersion": "", "machineID": "",
                "systemUUID": "", "bootID": "",
            },
        }}

    def powered_nodes(self) -> list[str]:
        with self.lock:
            return [node for node in self.nodes if node not in self.powered_off]

    def register_nodes(self) -> None:
        for node_name in self.powered_nodes():
            manifest = self.node_manifest(node_name)
            try:
                self.core.create_node(manifest)
            except ApiException as error:
                if error.status != 409:
                    raise
                self.core.patch_node(node_name, manifest)
            self.core.patch_node_status(node_name, self.node_status(node_name))
            self.log(f"registered node {node_name}" + (f" with {self.config.gpus_per_node} x "
                                                        f"{self.config.gpu_node_types().get(node_name)}"
                                                        if self._is_gpu_node(node_name) else " (no GPU)"))

    def renew_leases(self, nodes: list[str]) -> None:
        for node_name in nodes:
            now = datetime.datetime.now(datetime.timezone.utc)
            spec = client.V1LeaseSpec(holder_identity=node_name, renew_time=now,
                                      lease_duration_seconds=LEASE_DURATION_SECONDS)
            try:
                self.coordination.patch_namespaced_lease(
                    node_name, LEASE_NAMESPACE, {"spec": {"holderIdentity": node_name,
                                                          "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                                                          "leaseDurationSeconds": LEASE_DURATION_SECONDS}})
            except ApiException as error:
                if error.status != 404:
                    raise
                node = self.core.read_node(node_name)
                self.coordination.create_namespaced_lease(LEASE_NAMESPACE, client.V1Lease(
                    metadata=client.V1ObjectMeta(name=node_name, owner_references=[
                        client.V1OwnerReference(api_version="v1", kind="Node", name=node_name,
                                                uid=node.metadata.uid)]),
                    spec=spec))

    def heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_SECONDS):
            try:
                self.renew_leases(self.powered_nodes())
                if time.monotonic() - last_status >= NODE_STATUS_SECONDS:
                    for node_name in self.powered_nodes():
                        self.core.patch_node_status(node_name, self.node_status(node_name))
                    last_status = time.monotonic()
            except Exception as error:  # noqa: BLE001 - keep beating through apiserver blips
                self.log(f"heartbeat failed: {error!r}")

    def power_loop(self) -> None:
        while not self.stopping.wait(POWER_POLL_SECONDS):
            try:
                wanted_off = faults.powered_off_nodes(self.config.state_dir) & set(self.nodes)
            except (OSError, ValueError) as error:
                self.log(f"reading the powered-off nodes failed: {error!r}")
                continue
            for node_name in sorted(wanted_off - self.powered_off):
                self.power_off(node_name)
            for node_name in sorted(self.powered_off - wanted_off):
                self.power_on(node_name)

    def power_off(self, node_name: str) -> None:
        """As when a machine is unplugged: its processes die at once and nothing reports
        anything; the control plane notices only the missing heartbeats."""
        with self.lock:
            self.powered_off.add(node_name)
            workers = [w for w in self.workers.values() if w.pod["spec"].get("nodeName") == node_name]
        for worker in workers:
            worker.request_stop(0, delete_object=False, report_final_status=False)
        for worker in workers:
            worker.join(timeout=15)
        with self.lock:
            # Its pods start again when the power returns, as after a reboot, unless evicted.
            self.finished_uids -= {worker.uid for worker in workers}
        self.log(f"node {node_name} powered off ({len(workers)} pods' processes killed)")

    def power_on(self, node_name: str) -> None:
        with self.lock:
            self.powered_off.discard(node_name)
        try:
            self.renew_leases([node_name])
            self.core.patch_node_status(node_name, self.node_status(node_name))
            listing = self.core.api_client.sanitize_for_serialization(
                self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}"))
        except Exception as error:  # noqa: BLE001 - the next poll tries again
            self.log(f"node {node_name}: power-on heartbeat or pod list failed, retrying: {error!r}")
            with self.lock:
                self.powered_off.add(node_name)
            return
        for pod in listing["items"]:
            self.handle_pod("ADDED", pod)
        self.log(f"node {node_name} powered on")

    # -- pods -----------------------------------------------------------------------------

    def handle_pod(self, event_type: str, pod: dict) -> None:
        metadata = pod["metadata"]
        uid = metadata["uid"]
        with self.lock:
            if pod["spec"].get("nodeName") in self.powered_off:
                return  # nothing runs there; powered on, it lists its pods again
            worker = self.workers.get(uid)
            finished = uid in self.finished_uids
        if event_type == "DELETED":
            if worker is not None:
                worker.request_stop(0, delete_object=False)
            return
        deleting = metadata.get("deletionTimestamp") is not None
        if deleting:
            grace = metadata.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            if worker is not None:
                worker.request_stop(grace, delete_object=True)
            else:
                self.delete_pod_object(metadata["namespace"], metadata["name"], uid)
            return
        phase = (pod.get("status") or {}).get("phase")
        if worker is None and not finished and phase not in ("Succeeded", "Failed"):
            worker = PodWorker(self, pod)
            with self.lock:
                self.workers[uid] = worker
            worker.start()
        elif worker is not None:
            worker.pod = pod

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> None:
        for stale in network.list_pod_namespaces(self.config.network):
            network.delete_pod_namespace(stale)
        self.register_nodes()
        self.renew_leases(self.powered_nodes())
        threads = [threading.Thread(target=self.heartbeat_loop, daemon=True),
                   threading.Thread(target=self.power_loop, daemon=True)]
        # Like the kubelet, each node watches only the pods bound to it.
        threads += [threading.Thread(target=watch_forever, daemon=True, args=(
            self.core.list_pod_for_all_namespaces, each_object(self.handle_pod), self.stopping), kwargs={
                "what": f"pod ({node})", "log": self.log, "watch_seconds": POD_WATCH_SECONDS,
                "read_timeout_seconds": POD_WATCH_READ_TIMEOUT_SECONDS, "field_selector": f"spec.nodeName={node}"})
            for node in self.nodes]
        for thread in threads:
            thread.start()
        self.stopping.wait()
        self.shutdown_pods()

    def shutdown_pods(self) -> None:
        """Stop every pod's processes; the pod objects stay for the next start."""
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            grace = worker.pod["spec"].get("terminationGracePeriodSeconds", 30)
            worker.request_stop(min(grace, SHUTDOWN_GRACE_SECONDS), delete_object=False,
                                report_final_status=False)
        for worker in workers:
            worker.join(timeout=15)
        for stale in network.list_pod_namespaces(self.config.network):
            network.delete_pod_namespace(stale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="sandbox.json written by `sandbox up`")
    args = parser.parse_args(argv)
    settings = json.loads(open(args.settings).read())
    config = SandboxConfig.from_dict(settings["config"])
    agent = NodeAgent(config, settings["kubernetesVersion"])

    def stop(signum, frame):
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
