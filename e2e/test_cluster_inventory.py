"""The planner plans for the cluster it is in: the e2e sandbox has two H100 nodes and one L40S
node (conftest). A spec allowing H200 or L40S, whose cheapest plan offline is one H200, lands
on the L40S node; a second deployment that needs more L40S than are left serves what the free
ones hold and says CapacityShortfall, naming how many more it needs."""

from __future__ import annotations

import pytest
import yaml

from conftest import L40S_NODE, wait_until_ready
from llmfleet_sandbox.manager import DEMO_MANIFEST

pytestmark = pytest.mark.e2e
NAMESPACE = "inventory"
H200, L40S = "H200-SXM-141GB", "L40S-48GB"


def chat(name: str, allowed_gpu_types: list[str], peak_requests_per_second: float) -> dict:
    """The sandbox demo's 70B chat deployment, without autoscaling: it serves the plan's replicas."""
    manifest = yaml.safe_load(DEMO_MANIFEST.read_text())
    manifest["metadata"] = {"name": name, "namespace": NAMESPACE}
    spec = manifest["spec"]
    del spec["autoscaling"]
    spec["resources"] = {"allowedGpuTypes": allowed_gpu_types}
    spec["workload"]["peakRequestsPerSecond"] = peak_requests_per_second
    return manifest


def _serving_pods(sandbox, name: str) -> list[dict]:
    return sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                f"llmfleet.io/deployment={name},app.kubernetes.io/component=server")["items"]


def _condition(deployment: dict, kind: str) -> dict:
    return next(c for c in deployment["status"]["conditions"] if c["type"] == kind)


@pytest.fixture(scope="module", autouse=True)
def inventory_namespace(sandbox, operator):
    sandbox.kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    sandbox.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_a_spec_lands_on_the_gpu_type_the_cluster_has_and_a_shortfall_serves_what_fits(sandbox):
    sandbox.apply([chat("fits", [H200, L40S], 1)], namespace=NAMESPACE)
    fits = wait_until_ready(sandbox, "fits", NAMESPACE, timeout=300)
    plan = fits["status"]["plan"]
    assert (plan["gpuType"], plan["replicas"]) == (L40S, 1), plan
    assert any(H200 in r["option"] and r["reason"].startswith("cluster: 0 H200-SXM-141GB are schedulable")
               for r in plan["rejected"]), plan["rejected"]
    assert _condition(fits, "Planned")["status"] == "True"
    assert [pod["spec"]["nodeName"] for pod in _serving_pods(sandbox, "fits")] == [L40S_NODE]
    gpus_per_replica = plan["tensorParallelSize"]

    # Three times the load: more L40S replicas than the node has GPUs left beside "fits".
    sandbox.apply([chat("short", [L40S], 3)], namespace=NAMESPACE)
    short = wait_until_ready(sandbox, "short", NAMESPACE, timeout=300)
    plan = short["status"]["plan"]
    free = 8 - gpus_per_replica
    assert plan["gpuType"] == L40S and plan["replicas"] == free // plan["tensorParallelSize"], plan
    planned = _condition(short, "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "CapacityShortfall"), planned
    assert f"but {free} L40S-48GB are free" in planned["message"] and "more L40S-48GB needed" in planned["message"]
    assert plan["capacityShortfall"] in planned["message"]
    assert _condition(short, "Ready")["status"] == "True"
    pods = _serving_pods(sandbox, "short")
    assert len(pods) == plan["replicas"] and {pod["spec"]["nodeName"] for pod in pods} == {L40S_NODE}
