"""The cluster's GPUs as the planner sees them, node by node, from Node and Pod objects.

A GPU node is known by GPU Feature Discovery's product label (`nvidia.com/gpu.product`),
mapped to the catalog's GPU type, and its allocatable `nvidia.com/gpu`; its pool by the first
node-pool label it carries (`gpu_discovery.NODE_POOL_LABELS`), else its product. It counts while
it is Ready and schedulable. A GPU is free when no bound, unfinished pod of another workload at
the same or a higher priority holds it: the deployment being planned may reuse its own pods'
GPUs, since a new plan replaces them, and the scheduler preempts lower-priority pods for its
pods. Pure: the caller passes the objects (the operator from its indexes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmfleet.catalog import Catalog, load_catalog
from llmfleet.gpu_discovery import GPU_PRODUCT_LABEL, GPU_RESOURCE, NODE_POOL_LABELS
from llmfleet.planner.types import ClusterGpus, NodeGpus

FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class GpuNode:
    name: str
    gpu_product: str
    allocatable_gpus: int
    schedulable: bool
    pool: str  # `label=value`, see node_pool


@dataclass(frozen=True)
class GpuPod:
    """A pod that holds GPUs on a node: bound to it and not finished."""

    namespace: str
    deployment: str | None  # its LLMDeployment's label value, when it belongs to one
    node: str
    gpus: int
    priority: int = 0  # spec.priority, which admission resolves from the pod's PriorityClass


def gpu_node(node: dict) -> GpuNode | None:
    """The node's GPUs, or None for a node without GPU Feature Discovery's product label."""
    metadata, status = node["metadata"], node.get("status") or {}
    labels = metadata.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    if not product:
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return GpuNode(metadata["name"], product, _count(status.get("allocatable"), GPU_RESOURCE),
                   ready and not (node.get("spec") or {}).get("unschedulable", False), node_pool(labels))


def node_pool(labels: dict[str, str]) -> str:
    """The node's pool as `label=value`: its provisioner's node-pool label, else its GPU product
    (the nodes of one product without a pool label are taken as one pool)."""
    label = next((label for label in NODE_POOL_LABELS if labels.get(label)), GPU_PRODUCT_LABEL)
    return f"{label}={labels[label]}"


# The pods gpu_pod() can count, as an API field selector: bound to a node, not finished.
GPU_POD_FIELD_SELECTOR = "spec.nodeName!=," + ",".join(f"status.phase!={phase}" for phase in sorted(FINISHED_PHASES))


def gpu_pod(pod: dict, deployment_label: str) -> GpuPod | None:
    """The GPUs a pod holds, or None when it holds none (no GPU request, not bound, finished);
    `deployment_label` is the label that names a pod's LLMDeployment."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node = spec.get("nodeName")
    if not node or status.get("phase") in FINISHED_PHASES:
        return None
    # As the scheduler counts: the larger of the app containers' sum and any init container.
    app = sum(_gpus(c) for c in spec.get("containers") or [])
    init = max((_gpus(c) for c in spec.get("initContainers") or []), default=0)
    gpus = max(app, init)
    if not gpus:
        return None
    metadata = pod["metadata"]
    return GpuPod(metadata["namespace"], (metadata.get("labels") or {}).get(deployment_label), node, gpus,
                  spec.get("priority") or 0)


def cluster_gpus(nodes: Iterable[GpuNode], pods: Iterable[GpuPod], namespace: str, deployment: str,
                 priority: int = 0, catalog: Catalog | None = None) -> ClusterGpus:
    """The GPUs of each schedulable node, and those free for the LLMDeployment whose pods in
    `namespace` carry the label value `deployment` and run at `priority`. Products the catalog
    does not know are left out."""
    pods = list(pods)
    own = [pod for pod in pods if (pod.namespace, pod.deployment) == (namespace, deployment)]
    holding = [pod for pod in pods
               if (pod.namespace, pod.deployment) != (namespace, deployment) and pod.priority >= priority]
    return node_gpus(nodes, holding, catalog, own)


def node_gpus(nodes: Iterable[GpuNode], pods: Iterable[GpuPod], catalog: Catalog | None = None,
              own: Iterable[GpuPod] = ()) -> ClusterGpus:
    """Ready and schedulable nodes of a catalog GPU type, by name, each with the GPUs `pods` do
    not hold, and of those the ones `own` (the deployment's pods) hold."""
    catalog = catalog or load_catalog()
    type_of_product = {gpu.gfd_product: gpu.name for gpu in catalog.gpus.values()}
    held_on, own_on = _gpus_on(pods), _gpus_on(own)
    counted = []
    for node in sorted(nodes, key=lambda n: n.name):
        gpu_type = type_of_product.get(node.gpu_product)
        if gpu_type is None or not node.schedulable:
            continue
        # A node can report pods holding more than it has (allocatable shrank under them).
        free = node.allocatable_gpus - min(node.allocatable_gpus, held_on.get(node.name, 0))
        counted.append(NodeGpus(node.name, gpu_type, node.pool, node.allocatable_gpus, free,
                                min(free, own_on.get(node.name, 0))))
    return ClusterGpus(tuple(counted))


def _gpus_on(pods: Iterable[GpuPod]) -> dict[str, int]:
    """GPUs the pods hold, per node."""
    held_on: dict[str, int] = {}
    for pod in pods:
        held_on[pod.node] = held_on.get(pod.node, 0) + pod.gpus
    return held_on


def _gpus(container: dict) -> int:
    """A container's GPUs: extended resources are requested by limits (requests, if given,
    must equal them)."""
    resources = container.get("resources") or {}
    return _count(resources.get("limits"), GPU_RESOURCE) or _count(resources.get("requests"), GPU_RESOURCE)


def _count(resources: dict | None, resource: str) -> int:
    value = (resources or {}).get(resource)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0
