"""The sandbox is a real cluster: real apiserver and scheduler, pods that are
real processes, real Triton, Services through the proxy, real Prometheus."""

from __future__ import annotations

import os
import queue
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import L40S_NODE, wait_for
from llmfleet_sandbox import prometheus
from triton_fixtures import (
    model_repository_config_map,
    service,
    single_pod,
    triton_deployment,
)

DEPLOYMENT = "triton-smoke"
GPUS_PER_NODE = 8


def _pod(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "pod", name)


def _pods(sandbox, app: str) -> list[dict]:
    return sandbox.kubectl_json("get", "pods", "-l", f"app={app}")["items"]


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except Exception:  # noqa: BLE001 - any failure is "not answering"
        return 0


def triton_processes(sandbox, pod_name_prefix: str) -> list[int]:
    """Pids of tritonserver processes serving pods whose name starts with the prefix (the
    sandbox sets HOSTNAME to the pod's name, as a runtime does)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if (cmdline and cmdline[0].endswith("tritonserver")
                and any(v.startswith(f"HOSTNAME={pod_name_prefix}") for v in environ)):
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def triton_deployment_ready(sandbox):
    sandbox.apply([model_repository_config_map("token-streamer-repo", load_delay_seconds=3),
                   triton_deployment(DEPLOYMENT, "token-streamer-repo"), service(DEPLOYMENT)])
    observed_running_not_ready = False

    def ready_pod():
        nonlocal observed_running_not_ready
        pods = _pods(sandbox, DEPLOYMENT)
        if len(pods) != 1:
            return None
        pod = pods[0]
        running = pod["status"].get("phase") == "Running"
        if running and not _ready(pod):
            observed_running_not_ready = True
        return pod if running and _ready(pod) else None

    pod = wait_for(ready_pod, 60, "the Triton pod to be Ready")
    yield pod, observed_running_not_ready
    sandbox.kubectl("delete", "deployment", DEPLOYMENT, "--ignore-not-found", "--wait=true")


def _settled_nodes(sandbox) -> list[dict] | None:
    """The nodes once the node lifecycle controller has lifted the not-ready taints it puts on
    every new node (a moment after the node reports Ready)."""
    nodes = sandbox.kubectl_json("get", "nodes")["items"]
    lifted = all(not taint["key"].startswith("node.kubernetes.io/")
                 for node in nodes for taint in node["spec"].get("taints") or [])
    return nodes if lifted else None


def test_nodes_are_ready_gpu_nodes_and_one_cpu_node(sandbox):
    all_nodes = wait_for(lambda: _settled_nodes(sandbox), 60, "the not-ready taints to be lifted")
    nodes = [node for node in all_nodes if node["metadata"]["name"].startswith("gpu-node-")]
    (cpu_node,) = [node for node in all_nodes if node["metadata"]["name"] == "cpu-node-1"]
    assert len(nodes) == 3 and len(all_nodes) == 4
    assert not cpu_node["spec"].get("taints") and "nvidia.com/gpu" not in cpu_node["status"]["capacity"]
    assert "nvidia.com/gpu.product" not in cpu_node["metadata"]["labels"]
    for node in nodes:
        assert node["status"]["capacity"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        labels = node["metadata"]["labels"]
        l40s = node["metadata"]["name"] == L40S_NODE  # the extra pool
        assert labels["nvidia.com/gpu.product"] == ("NVIDIA-L40S" if l40s else "NVIDIA-H100-80GB-HBM3")
        assert labels["nvidia.com/gpu.count"] == str(GPUS_PER_NODE)
        assert int(labels["nvidia.com/gpu.memory"]) > (45000 if l40s else 80000)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    lease = sandbox.kubectl_json("get", "lease", "-n", "kube-node-lease", nodes[0]["metadata"]["name"])
    assert lease["spec"]["holderIdentity"] == nodes[0]["metadata"]["name"]


def test_pod_is_ready_only_after_triton_is_ready(sandbox, triton_deployment_ready):
    pod, observed_running_not_ready = triton_deployment_ready
    # The model takes 3 s to load: the pod must have been Running but not Ready meanwhile.
    assert observed_running_not_ready
    pod_ip = pod["status"]["podIP"]
    assert _http_status(f"http://{pod_ip}:8000/v2/health/ready") == 200


def test_health_answers_on_pod_ip_and_through_the_service(sandbox, triton_deployment_ready):
    pod, _ = triton_deployment_ready
    cluster_ip = sandbox.kubectl_json("get", "service", DEPLOYMENT)["spec"]["clusterIP"]
    assert _http_status(f"http://{pod['status']['podIP']}:8000/v2/health/ready") == 200
    wait_for(lambda: _http_status(f"http://{cluster_ip}:8000/v2/health/ready") == 200, 15,
             "the Service to answer")


def test_streamed_request_through_the_service_returns_tokens(sandbox, triton_deployment_ready):
    cluster_ip = sandbox.kubectl_json("get", "service", DEPLOYMENT)["spec"]["clusterIP"]
    tokens: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"{cluster_ip}:8001")
    client.start_stream(callback=lambda result, error: tokens.put(error or result))
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"hello sandbox"], dtype=np.object_))
    max_tokens = grpcclient.InferInput("MAX_TOKENS", [1], "INT32")
    max_tokens.set_data_from_numpy(np.array([6], dtype=np.int32))
    client.async_stream_infer("token_streamer", [prompt, max_tokens])
    received = []
    for _ in range(6):
        result = tokens.get(timeout=10)
        assert not isinstance(result, Exception), result
        received.append(result.as_numpy("TOKEN")[0].decode())
    client.stop_stream()
    client.close()
    assert received == ["hello#0", "sandbox#1", "hello#2", "sandbox#3", "hello#4", "sandbox#5"]


def test_prometheus_scrapes_the_pod(sandbox, triton_deployment_ready):
    pod, _ = triton_deployment_ready
    name = pod["metadata"]["name"]

    def scraped_up():
        results = prometheus.query(sandbox.env, f'up{{pod="{name}"}}')
        return results and results[0]["value"][1] == "1"

    wait_for(scraped_up, 30, f"Prometheus to report up == 1 for {name}")


def test_killed_process_is_seen_as_container_restart(sandbox, triton_deployment_ready):
    pod, _ = triton_deployment_ready
    name = pod["metadata"]["name"]
    pids = triton_processes(sandbox, name)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)

    def restarted_and_ready():
        current = _pod(sandbox, name)
        status = current["status"]["containerStatuses"][0]
        return status["restartCount"] == 1 and _ready(current) and status
    status = wait_for(restarted_and_ready, 60, "the container restart")
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    assert triton_processes(sandbox, name) != pids


def test_scaling_follows_with_processes_and_delete_leaves_none(sandbox, triton_deployment_ready):
    sandbox.kubectl("scale", "deployment", DEPLOYMENT, "--replicas=3")
    wait_for(lambda: sum(_ready(p) for p in _pods(sandbox, DEPLOYMENT)) == 3, 60, "3 ready replicas")
    assert len(triton_processes(sandbox, DEPLOYMENT)) == 3
    sandbox.kubectl("scale", "deployment", DEPLOYMENT, "--replicas=1")
    wait_for(lambda: len(_pods(sandbox, DEPLOYMENT)) == 1, 60, "scale down to 1 pod")
    wait_for(lambda: len(triton_processes(sandbox, DEPLOYMENT)) == 1, 20, "one Triton process")
    sandbox.kubectl("delete", "deployment", DEPLOYMENT, "--wait=true")
    wait_for(lambda: not _pods(sandbox, DEPLOYMENT), 60, "pods to be gone")
    wait_for(lambda: not triton_processes(sandbox, DEPLOYMENT), 20, "no Triton process")


def test_unknown_image_gets_a_clear_failure_reason(sandbox):
    image = "registry.invalid/unknown/llm:1.0"
    sandbox.apply([single_pod("unknown-image", image)])

    def waiting_reason():
        statuses = _pod(sandbox, "unknown-image").get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None
    waiting = wait_for(waiting_reason, 30, "ErrImagePull")
    assert image in waiting["message"]
    assert _pod(sandbox, "unknown-image")["status"]["phase"] == "Pending"
    sandbox.kubectl("delete", "pod", "unknown-image", "--wait=true")


def test_pod_asking_for_too_many_gpus_stays_pending_with_scheduler_reason(sandbox):
    sandbox.apply([single_pod("too-many-gpus", "python:3.11-slim", gpus=GPUS_PER_NODE + 1,
                              command=["python3", "-c", "print('never runs')"])])

    def unschedulable():
        conditions = _pod(sandbox, "too-many-gpus").get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    condition = wait_for(unschedulable, 30, "the scheduler's verdict")
    assert condition["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    time.sleep(2)
    assert _pod(sandbox, "too-many-gpus")["status"]["phase"] == "Pending"
    sandbox.kubectl("delete", "pod", "too-many-gpus", "--wait=true")
