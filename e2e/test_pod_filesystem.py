"""Containers see their volumes, their image's files and the host at real paths, in a mount
namespace of their own, and the host's own filesystem is left as it was."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from conftest import temporary_namespace, wait_for
from triton_fixtures import GPU_TOLERATION, TRITON_IMAGE

NAMESPACE = "pod-filesystem"
MARKER = "/tmp/llmfleet-pod-filesystem-marker"

IDENTITY_CONFIG = """name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

IDENTITY_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())])
            for request in requests]
"""

IN_CLUSTER_CLIENT = """import json, os, ssl, urllib.request
account = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(account + "/token").read()
namespace = open(account + "/namespace").read()
context = ssl.create_default_context(cafile=account + "/ca.crt")
url = "https://%s:%s/api" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(request, context=context, timeout=10) as response:
    kind = json.load(response)["kind"]
print(json.dumps({"namespace": namespace, "kind": kind, "cwd": os.getcwd(),
                  "gpu": os.environ.get("LLMFLEET_SANDBOX_GPU_PRODUCT")}))
"""


def _pod(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "pod", "-n", NAMESPACE, name)


def _terminated(sandbox, name: str) -> dict | None:
    statuses = _pod(sandbox, name).get("status", {}).get("containerStatuses") or []
    return statuses[0]["state"].get("terminated") if statuses else None


def _http(url: str, body: dict | None = None) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except Exception:  # noqa: BLE001 - any failure is "not answering"
        return 0, None


@pytest.fixture(scope="module")
def namespace(sandbox):
    with temporary_namespace(sandbox, NAMESPACE):
        # Pods are admitted once the default ServiceAccount exists; its token mount needs the CA.
        wait_for(lambda: sandbox.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False)
                 .startswith("NAME"), 30, "the default ServiceAccount")
        wait_for(lambda: sandbox.kubectl("get", "configmap", "kube-root-ca.crt", "-n", NAMESPACE,
                                         check=False).startswith("NAME"), 30, "the kube-root-ca.crt ConfigMap")
        yield NAMESPACE


def test_triton_started_by_a_shell_serves_a_model_from_a_config_map(sandbox, namespace):
    labels = {"app": "identity"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "identity"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "tolerations": [GPU_TOLERATION],
                "containers": [{
                    "name": "triton", "image": TRITON_IMAGE,
                    "command": ["/bin/sh", "-c"],
                    "args": [f"mkdir -p {MARKER} && exec tritonserver --model-repository=/models "
                             "--model-control-mode=none"],
                    "ports": [{"name": "http", "containerPort": 8000},
                              {"name": "grpc", "containerPort": 8001},
                              {"name": "metrics", "containerPort": 8002}],
                    # An exec probe runs in the container's mount view: the marker is in its /tmp.
                    "startupProbe": {"exec": {"command": ["test", "-d", MARKER]},
                                     "periodSeconds": 1, "failureThreshold": 30},
                    "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                                       "periodSeconds": 1},
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": [{"name": "models", "mountPath": "/models"},
                                     {"name": "scratch", "mountPath": "/tmp"}],
                }],
                "volumes": [
                    {"name": "models", "configMap": {"name": "identity-repo", "items": [
                        {"key": "config.pbtxt", "path": "identity/config.pbtxt"},
                        {"key": "model.py", "path": "identity/1/model.py"}]}},
                    {"name": "scratch", "emptyDir": {}},
                ],
            },
        }},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "identity"},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000}]}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "identity-repo"},
                  "data": {"config.pbtxt": IDENTITY_CONFIG, "model.py": IDENTITY_MODEL}}
    sandbox.apply([config_map, deployment, service], namespace=namespace)

    def ready_pod():
        pods = sandbox.kubectl_json("get", "pods", "-n", namespace, "-l", "app=identity")["items"]
        return next((pod for pod in pods if any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))), None)

    try:
        pod = wait_for(ready_pod, 90, "the Triton pod to be Ready")
    except AssertionError:
        pods = sandbox.kubectl_json("get", "pods", "-n", namespace, "-l", "app=identity")["items"]
        logs = "\n".join(sandbox.container_log(p, "triton")[-3000:] for p in pods)
        raise AssertionError(f"Triton pod not Ready: {[p.get('status') for p in pods]}\n{logs}") from None
    cluster_ip = sandbox.kubectl_json("get", "service", "-n", namespace, "identity")["spec"]["clusterIP"]
    wait_for(lambda: _http(f"http://{cluster_ip}:8000/v2/health/ready")[0] == 200, 15,
             "readiness through the Service")
    status, result = _http(f"http://{cluster_ip}:8000/v2/models/identity/infer", {"inputs": [
        {"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1.5, 2.0, -3.0]}]})
    assert status == 200, result
    assert result["outputs"][0]["data"] == [1.5, 2.0, -3.0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # The pod's /tmp is its emptyDir; its mount points were never made on the host.
    assert not os.path.lexists(MARKER)
    for path in ("/models", "/opt/tritonserver"):
        assert not os.path.lexists(path), f"{path} was created on the host"
    sandbox.kubectl("delete", "deployment", "-n", namespace, "identity", "--wait=true")


def test_service_account_token_at_its_real_path_reaches_the_apiserver(sandbox, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "in-cluster-client"},
           "spec": {"restartPolicy": "Never", "tolerations": [GPU_TOLERATION],
                    "containers": [{"name": "main", "image": "python:3.12-slim",
                                    "command": ["python3", "-c", IN_CLUSTER_CLIENT],
                                    "workingDir": "/srv/client",
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    sandbox.apply([pod], namespace=namespace)
    terminated = wait_for(lambda: _terminated(sandbox, "in-cluster-client"), 60, "the client to finish")
    log = sandbox.container_log(_pod(sandbox, "in-cluster-client"), "main")
    assert terminated["exitCode"] == 0, log
    report = json.loads(log.strip().splitlines()[-1])
    node = _pod(sandbox, "in-cluster-client")["spec"]["nodeName"]
    product = sandbox.kubectl_json("get", "node", node)["metadata"]["labels"]["nvidia.com/gpu.product"]
    assert report == {"namespace": namespace, "kind": "APIVersions", "cwd": "/srv/client", "gpu": product}
    for path in ("/run/secrets/kubernetes.io", "/srv/client"):
        assert not os.path.lexists(path), f"{path} was created on the host"


def test_a_command_missing_from_the_image_is_a_start_error(sandbox, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "missing-command"},
           "spec": {"restartPolicy": "Never", "tolerations": [GPU_TOLERATION],
                    "containers": [{"name": "main", "image": "busybox:1.36",
                                    "command": ["no-such-program"]}]}}
    sandbox.apply([pod], namespace=namespace)
    terminated = wait_for(lambda: _terminated(sandbox, "missing-command"), 30, "the start to fail")
    assert terminated["reason"] == "StartError"
    assert terminated["exitCode"] == 128
    assert 'exec: "no-such-program": executable file not found in $PATH' in terminated["message"]
