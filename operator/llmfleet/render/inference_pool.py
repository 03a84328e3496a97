"""Inference-aware routing (spec.routing.inferencePool): per revision an InferencePool selecting its
serving pods and the endpoint picker (EPP) it names, which scores each pod on Triton's
TensorRT-LLM queue and KV-cache metrics and prefix-cache hits; the HTTPRoute's backends are then
the pools. Everything follows the pinned Gateway API Inference Extension release
(catalog/routers/*.yaml), including the flags its picker refuses."""

from __future__ import annotations

from typing import Any

from llmfleet.api import InferencePoolSpec
from llmfleet.catalog.router_record import RouterRecord
from llmfleet.render import layout
from llmfleet.render.pod import bound_service_account, container_defaults, pod_security_context
from llmfleet.render.settings import RenderSettings
from llmfleet.render.yaml_text import yaml_text

POOL_COMPONENT = "inference-pool"
PICKER_COMPONENT = "endpoint-picker"
PICKER_CONFIG_FILE = "endpoint-picker.yaml"
PICKER_CONFIG_DIR = "/config"
# The namespace's ServiceAccount for pickers, bound to the chart's ClusterRole of that name.
PICKER_SERVICE_ACCOUNT = "llmfleet-endpoint-picker"
# The model-server engine whose metric names the picker reads (Triton with the TensorRT-LLM backend).
TRITON_ENGINE = "triton-tensorrt-llm"
# Scorer weights as the release's default configuration has them (defaults.go).
SCORER_WEIGHTS = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3))
# Our sizing for one pool's picker (the release's chart asks 4 CPUs and 8 GiB for a shared one):
# it keeps per-pod metrics and a prefix index for a handful of Triton pods.
PICKER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}


def inference_pool(metadata: dict[str, Any], pods: dict[str, str], picker_service: str,
                   spec: InferencePoolSpec, record: RouterRecord) -> dict[str, Any]:
    """The revision's serving pods as one pool, requests on Triton's HTTP port."""
    return {
        "apiVersion": record.pool_api_version,
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": pods},
            "targetPorts": [{"number": layout.HTTP_PORT}],
            "endpointPickerRef": {"name": picker_service, "port": {"number": record.ports["grpc"]},
                                  "failureMode": spec.failure_mode.value},
        },
    }


def picker_config() -> dict[str, Any]:
    """The picker's EndpointPickerConfig: the release's default scorers, with metrics read under
    Triton's TensorRT-LLM names (the built-in engine config)."""
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [*({"type": scorer} for scorer, _ in SCORER_WEIGHTS),
                    {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics"}},
                    {"type": "core-metrics-extractor", "parameters": {"defaultEngine": TRITON_ENGINE}}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": scorer, "weight": weight}
                                                              for scorer, weight in SCORER_WEIGHTS]}],
    }


def picker_config_map(metadata: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {PICKER_CONFIG_FILE: yaml_text(picker_config())}}


def picker_deployment(metadata: dict[str, Any], pool_name: str, config_map_name: str, spec: InferencePoolSpec,
                      record: RouterRecord, settings: RenderSettings) -> dict[str, Any]:
    """One picker per pool. It scrapes each pod's metrics port: the pool's target port is the
    inference port, and the deprecated --model-server-metrics-port is the release's only way to
    name another (read while the pool has one target port)."""
    labels = metadata["labels"]
    health = {"grpc": {"port": record.ports["grpc_health"], "service": record.health_service}}
    container = {
        "name": "endpoint-picker",
        "image": spec.image or record.image,
        "args": ["--pool-name", pool_name, "--pool-namespace", metadata["namespace"],
                 "--pool-group", record.pool_api_version.split("/")[0],
                 "--config-file", f"{PICKER_CONFIG_DIR}/{PICKER_CONFIG_FILE}",
                 "--model-server-metrics-port", str(layout.METRICS_PORT),
                 # No tracing collector, and no cluster-wide TokenReview grant for its metrics.
                 "--tracing=false", "--metrics-endpoint-auth=false", "--zap-encoder", "json"],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "grpc", "containerPort": record.ports["grpc"], "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": record.ports["grpc_health"], "protocol": "TCP"},
                  {"name": "metrics", "containerPort": record.ports["metrics"], "protocol": "TCP"}],
        "readinessProbe": {**health, "periodSeconds": 2},
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "resources": PICKER_RESOURCES,
        "volumeMounts": [{"name": "config", "mountPath": PICKER_CONFIG_DIR, "readOnly": True}],
        **container_defaults(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            # Two pickers of one pool would each keep their own view; the release elects a leader
            # only with --ha-enable-leader-election.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": PICKER_SERVICE_ACCOUNT,
                    "securityContext": {**pod_security_context(), "runAsUser": record.run_as_user,
                                        "runAsGroup": record.run_as_user, "fsGroup": record.run_as_user},
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": config_map_name}}],
                    **({"imagePullSecrets": [{"name": s} for s in settings.image_pull_secrets]}
                       if settings.image_pull_secrets else {}),
                },
            },
        },
    }


def picker_service(metadata: dict[str, Any], record: RouterRecord) -> dict[str, Any]:
    """What the pool's endpointPickerRef names: the gateway's ext-proc calls go here (gRPC)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"type": "ClusterIP", "selector": metadata["labels"],
                 "ports": [{"name": "grpc-ext-proc", "port": record.ports["grpc"], "targetPort": "grpc",
                            "protocol": "TCP", "appProtocol": "http2"}]},
    }


def picker_prerequisites(namespace: str, cluster_role: str) -> list[dict[str, Any]]:
    """The namespace's pickers may read its pods and pools (the chart's ClusterRole), no more."""
    return bound_service_account(PICKER_SERVICE_ACCOUNT, namespace, cluster_role)
