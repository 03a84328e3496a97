"""Nodes and pods as the operator's GPU indexes see them, for the planner, fleet and handler tests."""

from __future__ import annotations

from llmfleet.catalog import load_catalog
from llmfleet.render.identity import DEPLOYMENT_LABEL


def node(name: str, product: str | None, gpus: int = 8, ready: bool = True, unschedulable: bool = False,
         labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {**({"nvidia.com/gpu.product": product} if product else {}),
                                                  **(labels or {})}},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if product else {},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(namespace: str, on_node: str | None, gpus: int, deployment: str | None = None, phase: str = "Running",
        init_gpus: int = 0) -> dict:
    return {"metadata": {"namespace": namespace, "name": "p", "labels": {DEPLOYMENT_LABEL: deployment} if deployment else {}},
            "spec": {**({"nodeName": on_node} if on_node else {}),
                     "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}],
                     "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}]},
            "status": {"phase": phase}}


def product(gpu_type: str) -> str:
    return load_catalog().gpu(gpu_type).gfd_product
