"""The sandbox runs LeaderWorkerSets for real: the upstream controller and its webhooks (started
by `sandbox up`) make a group's pods, the scheduler puts them on different nodes, the worker
reaches the leader at LWS_LEADER_ADDRESS through the cluster's DNS and the headless Service the
controller made, and a dead worker restarts its whole group (RecreateGroupOnPodRestart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import temporary_namespace, wait_for
from triton_fixtures import GPU_TOLERATION

NAMESPACE = "lws-e2e"
NAME = "lws-smoke"
LEADER, WORKER = f"{NAME}-0", f"{NAME}-0-1"
LEADER_ADDRESS = f"{NAME}-0.{NAME}.{NAMESPACE}"
PORT = 8080
H100 = "NVIDIA-H100-80GB-HBM3"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"

# The leader answers with its hostname and address; the worker, once it has reached the leader
# by the address LWS gave it, logs what the leader said and opens its own port (its readiness).
LEADER_PROGRAM = f"""
import http.server, os, socket
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        name = socket.gethostname()
        body = ("hello from " + name + " at " + socket.gethostbyname(name)).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("", {PORT}), Hello).serve_forever()
"""
WORKER_PROGRAM = f"""
import http.server, os, socket, time, urllib.request
leader = os.environ["LWS_LEADER_ADDRESS"]
while True:
    try:
        said = urllib.request.urlopen("http://" + leader + ":{PORT}/", timeout=2).read().decode()
        break
    except OSError as error:
        print("leader not reachable yet:", error, flush=True)
        time.sleep(0.5)
print("reached", leader, "at", socket.gethostbyname(leader), "which said:", said, flush=True)
http.server.HTTPServer(("", {PORT}), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _template(role: str, program: str) -> dict:
    container = {"name": role, "image": "python:3.12", "command": ["python3", "-c", program],
                 "ports": [{"containerPort": PORT}],
                 "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                 "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {"spec": {
        "terminationGracePeriodSeconds": 2, "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"nvidia.com/gpu.product": H100},
        # A group spans nodes: no two of its pods on one node.
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {LWS_NAME_LABEL: NAME}},
            "topologyKey": "kubernetes.io/hostname"}]}},
        "containers": [container]}}


LEADER_WORKER_SET = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {"replicas": 1, "leaderWorkerTemplate": {
        "size": 2,
        "leaderTemplate": _template("leader", LEADER_PROGRAM),
        "workerTemplate": _template("worker", WORKER_PROGRAM)}},
}


def _pods(sandbox) -> dict[str, dict]:
    pods = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"{LWS_NAME_LABEL}={NAME}")["items"]
    return {pod["metadata"]["name"]: pod for pod in pods if not pod["metadata"].get("deletionTimestamp")}


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _group_ready(sandbox, other_than: dict[str, str] | None = None) -> dict[str, dict] | None:
    """The leader and the worker, both Ready (and, given old uids, both new pods)."""
    pods = _pods(sandbox)
    if set(pods) != {LEADER, WORKER} or not all(_ready(pod) for pod in pods.values()):
        return None
    if other_than and any(pods[name]["metadata"]["uid"] == uid for name, uid in other_than.items()):
        return None
    return pods


def _env(pod: dict) -> dict[str, str]:
    return {variable["name"]: variable.get("value") for variable in pod["spec"]["containers"][0].get("env") or []}


def _container_pid(pod: dict) -> int:
    """The container's process, the one whose HOSTNAME is the pod's (as the runtime sets it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HOSTNAME={pod['metadata']['name']}".encode() in environ and cmdline[:2] == [b"python3", b"-c"]:
            return int(proc.name)
    raise AssertionError(f"no container process for {pod['metadata']['name']}")


def _from_the_container(pod: dict, program: str) -> str:
    """Run a Python program in the pod's container's mount, network and UTS namespaces (its
    /etc/resolv.conf, its pod IP, its hostname), as `kubectl exec` would."""
    # This interpreter: the sandbox binds its environment into every container of a python image.
    result = subprocess.run(["nsenter", f"--target={_container_pid(pod)}", "--mount", "--net", "--uts", "--",
                             sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


REACH_THE_LEADER = f"""
import json, os, socket, urllib.request
leader = "{LEADER_ADDRESS}"
print(json.dumps({{"hostname": socket.gethostname(), "resolved": socket.gethostbyname(leader),
                  "said": urllib.request.urlopen("http://" + leader + ":{PORT}/", timeout=5).read().decode(),
                  "resolv.conf": open("/etc/resolv.conf").read()}}))
"""


@pytest.fixture(scope="module")
def leader_worker_set(sandbox):
    with temporary_namespace(sandbox, NAMESPACE, wait_s=180):
        sandbox.apply([LEADER_WORKER_SET], namespace=NAMESPACE)
        yield


def test_a_group_spans_two_nodes_and_the_worker_reaches_the_leader_by_its_lws_address(sandbox, leader_worker_set):
    pods = wait_for(lambda: _group_ready(sandbox), 120, f"{LEADER} and {WORKER} to be Ready")
    leader, worker = pods[LEADER], pods[WORKER]
    assert leader["spec"]["nodeName"] != worker["spec"]["nodeName"]
    # What the upstream webhook gives each pod of the group.
    assert _env(worker)["LWS_LEADER_ADDRESS"] == _env(leader)["LWS_LEADER_ADDRESS"] == LEADER_ADDRESS
    assert (_env(leader)["LWS_WORKER_INDEX"], _env(worker)["LWS_WORKER_INDEX"]) == ("0", "1")
    assert _env(worker)["LWS_GROUP_SIZE"] == "2"
    # The controller's headless Service, whose EndpointSlice names the leader by its hostname.
    service = sandbox.kubectl_json("get", "service", NAME, "-n", NAMESPACE)
    assert service["spec"]["clusterIP"] == "None"
    leader_ip = leader["status"]["podIP"]
    # The worker got there by itself (its readiness waited for it) ...
    said = f"which said: hello from {LEADER} at {leader_ip}"
    assert said in sandbox.container_log(worker, "worker")
    # ... and a new connection from its container goes the same way: the cluster DNS, the pod network.
    reached = json.loads(_from_the_container(worker, REACH_THE_LEADER))
    assert reached["hostname"] == WORKER
    assert reached["resolved"] == leader_ip
    assert reached["said"] == f"hello from {LEADER} at {leader_ip}"
    assert f"search {NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local" in reached["resolv.conf"]


def test_a_deleted_worker_restarts_its_whole_group(sandbox, leader_worker_set):
    before = wait_for(lambda: _group_ready(sandbox), 120, "the group to be Ready")
    old_uids = {name: pod["metadata"]["uid"] for name, pod in before.items()}
    spec = sandbox.kubectl_json("get", "leaderworkerset", NAME, "-n", NAMESPACE)["spec"]
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"  # the webhook's default
    sandbox.kubectl("delete", "pod", WORKER, "-n", NAMESPACE, "--wait=false")
    after = wait_for(lambda: _group_ready(sandbox, other_than=old_uids), 180,
                     "a new leader and a new worker, both Ready")
    assert after[LEADER]["spec"]["nodeName"] != after[WORKER]["spec"]["nodeName"]
    leader_ip = after[LEADER]["status"]["podIP"]
    said = f"which said: hello from {LEADER} at {leader_ip}"
    assert said in sandbox.container_log(after[WORKER], "worker")
