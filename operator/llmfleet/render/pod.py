"""Pod pieces shared by the engine build Job and the serving Deployment."""

from __future__ import annotations

from typing import Any

from llmfleet.api import ResourcesSpec
from llmfleet.catalog import load_catalog
from llmfleet.gpu_discovery import GPU_COUNT_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE
from llmfleet.planner.types import Plan
from llmfleet.render import layout
from llmfleet.render.identity import MANAGED_BY_LABEL, PROJECT
from llmfleet.render.settings import RenderSettings

NON_ROOT_UID = 1000
ENGINE_CACHE_VOLUME = "engine-cache"
TMP_VOLUME = "tmp"


def gpus_per_replica(plan: Plan) -> int:
    return plan.tensor_parallel_size * plan.pipeline_parallel_size


def gpus_per_pod(plan: Plan) -> int:
    """A serving pod's GPUs: the replica's, or one node's share of a replica spanning nodes
    (identity.require_whole_nodes: the share is whole)."""
    return gpus_per_replica(plan) // plan.nodes_per_replica


def gpu_scheduling(plan: Plan, resources: ResourcesSpec | None, gpus: int) -> dict[str, Any]:
    """Pod spec fields that place a pod of `gpus` GPUs on a node of the planned GPU with as
    many, at the deployment's priority.

    GPU Feature Discovery labels the product and the GPU count; `Gt` is strict, hence - 1.
    Engines are compiled for one GPU architecture, so the build Job is placed the same way.
    """
    gpu = load_catalog().gpu(plan.gpu_type)
    return {
        **({"priorityClassName": resources.priority_class_name} if resources and resources.priority_class_name else {}),
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [gpu.gfd_product]},
                {"key": GPU_COUNT_LABEL, "operator": "Gt", "values": [str(gpus - 1)]},
            ]}],
        }}},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_defaults() -> dict[str, Any]:
    """Fields every rendered container has. The root filesystem stays read-only: Triton, MPI
    and Python write to /tmp (an emptyDir). A container that fails without writing a
    termination message gets its log's tail as one, so a pod's status says why (the operator
    quotes it in conditions: a failed build's last error, a crash-looping engine's)."""
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def engine_cache_volume(settings: RenderSettings, *, read_only: bool) -> dict[str, Any]:
    return {"name": ENGINE_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": settings.engine_cache_claim_name, "readOnly": read_only}}


def engine_cache_claim(namespace: str, settings: RenderSettings) -> dict[str, Any]:
    """The namespace's engine cache, shared by every LLMDeployment there.

    It has no owner: deleting a deployment must not delete engines that others use or that a
    re-created deployment would rebuild for hours.
    """
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"],
                            "resources": {"requests": {"storage": settings.engine_cache_size}}}
    if settings.engine_cache_storage_class is not None:
        spec["storageClassName"] = settings.engine_cache_storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": settings.engine_cache_claim_name, "namespace": namespace,
                     "labels": {MANAGED_BY_LABEL: PROJECT}},
        "spec": spec,
    }


def engine_cache_mount(*, read_only: bool) -> dict[str, Any]:
    return {"name": ENGINE_CACHE_VOLUME, "mountPath": layout.ENGINE_CACHE_PATH, "readOnly": read_only}


def tmp_volume() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "emptyDir": {}}


def tmp_mount() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "mountPath": layout.TMP_PATH}


def writable_home_env() -> list[dict[str, str]]:
    """Tools that cache under $HOME (huggingface_hub, Python) get the writable /tmp."""
    return [{"name": "HOME", "value": layout.TMP_PATH}]


def image_pull_secrets(settings: RenderSettings) -> dict[str, Any]:
    if not settings.image_pull_secrets:
        return {}
    return {"imagePullSecrets": [{"name": name} for name in settings.image_pull_secrets]}


def bound_service_account(name: str, namespace: str, cluster_role: str) -> list[dict[str, Any]]:
    """A namespace's ServiceAccount and its RoleBinding to one of the chart's ClusterRoles, which
    the operator may bind but does not hold; created once when missing, like the engine cache claim."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]
