"""Manifests for tests that run a plain Triton Deployment in the sandbox."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def model_repository_config_map(name: str, load_delay_seconds: float) -> dict:
    model_dir = ASSETS / "token_streamer"
    config = (model_dir / "config.pbtxt").read_text() + (
        f'parameters {{ key: "load_delay_seconds" value: {{ string_value: "{load_delay_seconds}" }} }}\n')
    return {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
        "data": {"config.pbtxt": config, "model.py": (model_dir / "model.py").read_text()},
    }


def triton_deployment(name: str, config_map: str, replicas: int = 1, gpus: int = 1) -> dict:
    labels = {"app": name}
    container = {
        "name": "triton",
        "image": TRITON_IMAGE,
        "command": ["tritonserver"],
        "args": ["--model-repository=/models", "--model-control-mode=none",
                 "--exit-on-error=true", "--strict-readiness=true"],
        "ports": [{"name": "http", "containerPort": 8000}, {"name": "grpc", "containerPort": 8001},
                  {"name": "metrics", "containerPort": 8002}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 1, "failureThreshold": 1},
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "repo", "mountPath": "/models"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": "8002"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": [GPU_TOLERATION],
                    "containers": [container],
                    "volumes": [{"name": "repo", "configMap": {"name": config_map, "items": [
                        {"key": "config.pbtxt", "path": "token_streamer/config.pbtxt"},
                        {"key": "model.py", "path": "token_streamer/1/model.py"}]}}],
                },
            },
        },
    }


def service(name: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [
            {"name": "http", "port": 8000}, {"name": "grpc", "port": 8001},
            {"name": "metrics", "port": 8002}]},
    }


def single_pod(name: str, image: str, gpus: int = 0, command: list[str] | None = None) -> dict:
    container = {"name": "main", "image": image,
                 "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}}
    if command:
        container["command"] = command
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "tolerations": [GPU_TOLERATION],
                 "containers": [container]},
    }
